# shellcheck shell=bash
# Shell helpers the bench's comparison scripts share (sourced, not run).

# wait_port PORT: returns once something accepts on 127.0.0.1:PORT (up to 10 s).
wait_port() {
    for _ in $(seq 1 100); do
        if (exec 3<>/dev/tcp/127.0.0.1/"$1") 2>/dev/null; then return 0; fi
        sleep 0.1
    done
    echo "port $1 never opened" >&2
    return 1
}
