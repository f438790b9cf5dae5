#!/usr/bin/env bash
# Live comparison with the load balancers users would otherwise run: nginx
# (round-robin) and haproxy (balance leastconn), from Debian's packages, and
# kvgate serve, each in front of the same simulated mixed fleet (2 H100 + 2 A10G
# servers of an 8B model), driven in turn by the same open-loop trace.
#
#   make bench-peers                         # defaults below
#   REQUESTS=300 RATE=8 make bench-peers     # shorter
#
# Results: $OUT/results.json, $OUT/report.md and $OUT/plots/.
set -euo pipefail
cd "$(dirname "$0")/.."

OUT=${OUT:-bench-peers-out}
SCENARIO=${SCENARIO:-mixed-gpu}
REQUESTS=${REQUESTS:-480}
RATE=${RATE:-12}
BASE_PORT=${BASE_PORT:-18000}

need() {
	if command -v "$1" >/dev/null 2>&1; then return; fi
	if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
		echo "installing $2 from Debian's packages" >&2
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$2" >/dev/null
	else
		echo "bench-peers needs $1 (apt-get install $2)" >&2
		exit 1
	fi
}
need nginx nginx-light
need haproxy haproxy

mkdir -p bin
go build -o bin/kvgate ./cmd/kvgate

work=$(mktemp -d)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$work"
}
trap cleanup EXIT

h1=$((BASE_PORT + 1)) a1=$((BASE_PORT + 101))
upstreams=("127.0.0.1:$h1" "127.0.0.1:$((h1 + 1))" "127.0.0.1:$a1" "127.0.0.1:$((a1 + 1))")
nginx_port=$((BASE_PORT + 201)) haproxy_port=$((BASE_PORT + 202)) kvgate_port=$((BASE_PORT + 203))

cat >"$work/fleet.yaml" <<EOF
seed: 1
servers:
  - {name: h100, listen: "127.0.0.1:$h1", replicas: 2, gpu: h100, model: meta-llama/Llama-3.1-8B-Instruct, modelSize: 8b}
  - {name: a10g, listen: "127.0.0.1:$a1", replicas: 2, gpu: a10g, model: meta-llama/Llama-3.1-8B-Instruct, modelSize: 8b}
EOF

# nginx: round-robin over kept-alive upstream connections, responses unbuffered so
# that streams flow through.
{
	echo "daemon off; worker_processes 1; pid $work/nginx.pid; error_log $work/nginx.err warn;"
	echo "events { worker_connections 8192; }"
	echo "http {"
	echo "  access_log off; client_body_temp_path $work/nb; proxy_temp_path $work/np;"
	echo "  fastcgi_temp_path $work/nf; uwsgi_temp_path $work/nu; scgi_temp_path $work/ns;"
	echo "  upstream fleet {"
	for u in "${upstreams[@]}"; do echo "    server $u;"; done
	echo "    keepalive 512;"
	echo "  }"
	echo "  server {"
	echo "    listen 127.0.0.1:$nginx_port;"
	echo "    client_max_body_size 64m;"
	echo "    location / { proxy_pass http://fleet; proxy_http_version 1.1; proxy_set_header Connection \"\";"
	echo "      proxy_buffering off; proxy_request_buffering off; proxy_read_timeout 600s; }"
	echo "  }"
	echo "}"
} >"$work/nginx.conf"

# haproxy: least connections, the usual answer to uneven request lengths.
{
	echo "global"
	echo "  maxconn 8192"
	echo "defaults"
	echo "  mode http"
	echo "  timeout connect 2s"
	echo "  timeout client 10m"
	echo "  timeout server 10m"
	echo "frontend fe"
	echo "  bind 127.0.0.1:$haproxy_port"
	echo "  default_backend fleet"
	echo "backend fleet"
	echo "  balance leastconn"
	i=0
	for u in "${upstreams[@]}"; do echo "  server s$i $u"; i=$((i + 1)); done
} >"$work/haproxy.cfg"

# kvgate: one scheduler over the same four servers, the default (kvgate) picker.
{
	echo "apiVersion: gateway.kvgate.io/v1alpha1"
	echo "kind: InferenceGatewayConfig"
	echo "metadata: {name: peers}"
	echo "spec:"
	echo "  schedulers:"
	echo "    - name: llama"
	echo "      modelName: meta-llama/Llama-3.1-8B-Instruct"
	printf '      endpoints: ['
	sep=""
	for u in "${upstreams[@]}"; do printf '%s"%s"' "$sep" "$u"; sep=", "; done
	echo "]"
} >"$work/kvgate.yaml"

bin/kvgate sim --fleet "$work/fleet.yaml" --log-level warn &
pids+=($!)
nginx -c "$work/nginx.conf" -p "$work" &
pids+=($!)
haproxy -f "$work/haproxy.cfg" -db &
pids+=($!)
bin/kvgate serve --config "$work/kvgate.yaml" --listen "127.0.0.1:$kvgate_port" --admin-listen "127.0.0.1:$((BASE_PORT + 293))" --log-level warn &
pids+=($!)

for port in "$h1" "$((h1 + 1))" "$a1" "$((a1 + 1))"; do
	for _ in $(seq 100); do
		curl -fs "http://127.0.0.1:$port/health" >/dev/null && break
		sleep 0.1
	done
done
for _ in $(seq 100); do
	curl -fs "http://127.0.0.1:$((BASE_PORT + 293))/readyz" >/dev/null && break
	sleep 0.1
done

bin/kvgate bench --mode live --scenario "$SCENARIO" --quick --requests "$REQUESTS" --rate "$RATE" --pause 20s \
	--target "nginx=http://127.0.0.1:$nginx_port" \
	--target "haproxy=http://127.0.0.1:$haproxy_port" \
	--target "kvgate=http://127.0.0.1:$kvgate_port" \
	--out "$OUT"
