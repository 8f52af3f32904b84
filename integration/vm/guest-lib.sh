# Shell helpers shared by the two stages of the VM test guest.

# Kernel name of the namespace whose controller has serial $1.
ns() {
    for c in /sys/class/nvme/nvme*; do
        s=$(tr -d ' ' < "$c/serial")
        if [ "$s" = "$1" ]; then
            for b in "$c"/nvme*n1; do basename "$b"; return; done
        fi
    done
}
# md5 of the first and last MiB of /dev/$1.
hash_edges() {
    sz=$(cat "/sys/block/$1/size" 2>/dev/null || echo 4096)
    mib=$((sz / 2048))
    { dd if="/dev/$1" bs=1M count=1 2>/dev/null; dd if="/dev/$1" bs=1M skip=$((mib - 1)) count=1 2>/dev/null; } | md5sum | cut -d' ' -f1
}
cfg() { # name, then one [[devices]] body per argument
    f=/tmp/$1.toml; shift
    printf '[node]\nname = "vm"\nsocket = "/run/n.sock"\npodman_socket = "/run/p.sock"\njobs_dir = "/run/jobs"\ntest_dir = "/run/test"\n' > "$f"
    for e in "$@"; do printf '\n[[devices]]\n%b\n' "$e" >> "$f"; done
    chmod 600 "$f"
}
run() { # scenario, device-to-hash, gpuq-node args...
    name=$1; dev=$2; shift 2
    before=$(hash_edges "$dev")
    echo "GPUQ-BEGIN $name"
    /gpuq/gpuq-node --config "/tmp/$name.toml" "$@" --json
    rc=$?
    after=$(hash_edges "$dev")
    same=changed; [ "$before" = "$after" ] && same=same
    echo "GPUQ-END $name $rc $same"
}
show_json() { # name, file: print a JSON file (an audit record) as a scenario
    echo "GPUQ-BEGIN $1"
    cat "$2"
    echo "GPUQ-END $1 0 same"
}
