#!/bin/sh
# /init of the lab initramfs (busybox). Mounts the host root read-only over virtio-9p under a tmpfs overlay,
# switches into it and runs the lab's guest agent (lab/guest/agent.py) as the child of a reaping PID 1.
# Kernel command line: lab.agent=/abs/path/agent.py (required), lab.python=/usr/bin/python3, lab.shell=1.
export PATH=/bin:/sbin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for m in virtio_pci virtio_console virtio_blk 9pnet_virtio 9p overlay configfs; do modprobe "$m"; done

AGENT=""
PY=/usr/bin/python3
for o in $(cat /proc/cmdline); do
  case $o in
    lab.agent=*) AGENT=${o#lab.agent=} ;;
    lab.python=*) PY=${o#lab.python=} ;;
    lab.shell=1) SHELL1=1 ;;
  esac
done

mkdir -p /mnt/lower /mnt/rw
if ! mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=512000,cache=loose hostroot /mnt/lower; then
  echo "lab init: 9p mount of the host root failed"; exec sh
fi
mount -t tmpfs -o size=50% rw /mnt/rw
mkdir -p /mnt/rw/upper /mnt/rw/work
mount -t overlay -o lowerdir=/mnt/lower,upperdir=/mnt/rw/upper,workdir=/mnt/rw/work overlay /newroot
# the guest's modules live only in this initramfs: copy them before switch_root frees it
rm -rf /newroot/lib/modules
mkdir -p /newroot/lib/modules
cp -a /lib/modules/* /newroot/lib/modules/
mount -t proc proc /newroot/proc
mount -t sysfs sys /newroot/sys
mount -t devtmpfs dev /newroot/dev
mkdir -p /newroot/dev/pts /newroot/dev/shm
mount -t devpts devpts /newroot/dev/pts
mount -t tmpfs shm /newroot/dev/shm
mount -t tmpfs run /newroot/run
mount -t configfs configfs /newroot/sys/kernel/config
mount -t cgroup2 cgroup2 /newroot/sys/fs/cgroup
# /tmp stays the overlay's: the repository may live under the host's /tmp and must stay visible
# host identity must not leak into the guest: the agent generates a fresh host NQN / host ID
rm -f /newroot/etc/nvme/hostnqn /newroot/etc/nvme/hostid
echo "lab init: root ready at $(cut -d' ' -f1 /proc/uptime)s"
[ -n "$SHELL1" ] && exec switch_root /newroot /bin/sh
exec switch_root /newroot /bin/sh -c "$PY -u $AGENT; echo lab init: agent exited rc=\$?; echo o > /proc/sysrq-trigger; sleep 5"
