# Sourced by the CLI check scripts: the port a `dsv41 serve --port 0` listens on, read from its
# log once it says so (up to 60 s to load on a starved machine; empty if it never does). The
# server takes requests from the moment it prints the line.
listen_port() {  # $1: the server's log file
  for _ in $(seq 600); do grep -q "listening on" "$1" && break; sleep 0.1; done
  sed -n 's/.*listening on http:\/\/[^:]*:\([0-9]*\).*/\1/p' "$1" | head -n 1
}
