# Sourced by the bench's diagnostics (bench/wal/by-relation.sh, bench/ab/side-by-side.sh):
# a free loopback port, a field of `verdict tenant create --json`, and the callback receiver.

# free_port: a loopback port free at the moment of asking.
free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# json_field NAME: the field NAME of the JSON object on stdin.
json_field() { python3 -c 'import json, sys; print(json.load(sys.stdin)[sys.argv[1]])' "$1"; }

# start_receiver DIR: nginx answering 204 to everything on a free loopback port, with its
# config, pid and logs under DIR. Sets HOOK_PORT and adds nginx's pid to PIDS.
start_receiver() {
    local dir=$1
    HOOK_PORT=$(free_port)
    mkdir -p "$dir"
    cat >"$dir/nginx.conf" <<NGINX
daemon off;
worker_processes 1;
pid $dir/nginx.pid;
error_log $dir/error.log warn;
events { worker_connections 1024; }
http {
    access_log off;
    client_body_temp_path $dir/body;
    server { listen 127.0.0.1:$HOOK_PORT; location / { return 204; } }
}
NGINX
    nginx -p "$dir" -c "$dir/nginx.conf" >/dev/null 2>&1 &
    PIDS+=($!)
}
