# Sourced by scripts/test, scripts/servers and scripts/clocks: makes sure libfaketime is there,
# for the harness's fake clocks (crates/redis-local, ServerBuilder::fake_clock): installs
# Debian's `faketime` with apt-get when it is missing and we are root, else says how and exits.

# Where Debian puts it (crates/redis-local/src/clock.rs looks there too); FAKETIME_LIB overrides.
FAKETIME_DEFAULT_LIB=/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1

need_faketime() {
    if [[ -n "${FAKETIME_LIB:-}" || -f "$FAKETIME_DEFAULT_LIB" ]]; then
        return
    fi
    if [[ "${EUID}" -eq 0 ]]; then
        echo "libfaketime not found; installing faketime with apt-get" >&2
        apt-get update
        DEBIAN_FRONTEND=noninteractive apt-get install -y faketime
    else
        echo "libfaketime not found. Install it with:" >&2
        echo "    sudo apt-get update && sudo apt-get install -y faketime" >&2
        echo "or set FAKETIME_LIB=/path/to/libfaketime.so.1" >&2
        exit 1
    fi
}
