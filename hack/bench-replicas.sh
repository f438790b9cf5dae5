#!/usr/bin/env bash
# Live measurement of kvgate serve replicas sharing routing state
# (docs/scaling.md): one simulated fleet of 3 H100 servers of an 8B model
# (kvgate sim --fleet), driven by the same open-loop shared-prefix trace through,
# in turn, each setup on a fresh fleet (cold caches, fresh ports):
#
#   one     one kvgate serve replica
#   shared  three replicas sharing state through one redis-server
#   alone   the same three replicas without shared state
#
# Each setup sits behind haproxy in mode tcp, balance roundrobin: connections, not
# requests, are spread, as a Kubernetes Service (kube-proxy) spreads them. The
# bench client opens a connection per request in flight and keeps it alive, so the
# replicas see as many connections as there were requests in flight at once.
#
#   make bench-replicas                         # defaults below
#   REQUESTS=240 RATE=6 make bench-replicas     # shorter
#
# Per setup: TTFT percentiles (kvgate bench), the model servers' prefix-cache hit
# rate (vllm:prefix_cache_hits_total / queries_total over the run, the 3 servers
# summed), scrapes per second per model server (kvgate_sim_scrapes_total), CPU
# seconds per replica (/proc/PID/stat), requests and connections per replica, and
# with shared state the propagation delay (kvgate_replica_propagation_seconds) and
# kvgate_replica_messages_total. Results: $OUT/report.md, $OUT/results.json, and
# kvgate bench's own output per setup in $OUT/<setup>/.
set -euo pipefail
cd "$(dirname "$0")/.."

OUT=${OUT:-bench-results/replicas}
SCENARIO=${SCENARIO:-shared-prefix}
REQUESTS=${REQUESTS:-480}
RATE=${RATE:-7.5}
BASE_PORT=${BASE_PORT:-19000}
MODEL=meta-llama/Llama-3.1-8B-Instruct
SETUPS=(one shared alone)

# Tools from Debian's packages, installed in one go when missing and root.
missing=()
for pair in haproxy:haproxy jq:jq curl:curl; do
	command -v "${pair%%:*}" >/dev/null 2>&1 || missing+=("${pair#*:}")
done
if [ ${#missing[@]} -gt 0 ]; then
	if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
		echo "bench-replicas needs: apt-get install ${missing[*]}" >&2
		exit 1
	fi
	echo "installing ${missing[*]} from Debian's packages" >&2
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >/dev/null
fi
REDIS_SERVER=$(hack/redis.sh)

mkdir -p bin "$OUT"
go build -o bin/kvgate ./cmd/kvgate

work=$(mktemp -d)
live=() # processes of the setup running now
cleanup() {
	for p in "${live[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$work"
}
trap cleanup EXIT

started=$(date +%s)
tick=$(getconf CLK_TCK)

# cpu_s PID: the process's user + system CPU seconds so far.
cpu_s() {
	sed 's/^.*) //' "/proc/$1/stat" | awk -v t="$tick" '{ printf "%.3f\n", ($12 + $13) / t }'
}

# prom_sum URL NAME [MATCH]: the sum of NAME's samples at URL whose line contains
# MATCH (a label, say).
prom_sum() {
	curl -fsS "$1" | awk -v n="$2" -v m="${3:-}" '
		/^#/ { next }
		{ k = $0; sub(/[ {].*/, "", k) }
		k == n && index($0, m) { s += $NF }
		END { printf "%.17g\n", s + 0 }'
}

# buckets URL...: the kvgate_replica_propagation_seconds buckets summed over the
# URLs, one "le count" line per bucket, in increasing le.
buckets() {
	for u in "$@"; do curl -fsS "$u"; done | awk '
		/^kvgate_replica_propagation_seconds_bucket/ {
			match($0, /le="[^"]*"/); le = substr($0, RSTART + 4, RLENGTH - 5)
			c[le] += $NF
		}
		END { for (le in c) print le, c[le] }' | sort -g
}

# messages URL: kvgate_replica_messages_total at URL as {"outcome": n, ...}.
messages() {
	curl -fsS "$1" | awk '/^kvgate_replica_messages_total\{/ {
		match($0, /outcome="[^"]*"/); printf "{\"%s\":%s}\n", substr($0, RSTART + 9, RLENGTH - 10), $NF }' | jq -s 'add // {}'
}

# quantile Q < buckets: Q's value in ms, interpolated linearly inside its bucket
# (as Prometheus' histogram_quantile); ">B" when it falls past the last bound B.
quantile() {
	awk -v q="$1" '
		{ le[NR] = $1; c[NR] = $2 }
		END {
			if (NR == 0 || c[NR] == 0) { print "null"; exit }
			want = q * c[NR]; lo = 0; below = 0
			for (i = 1; i <= NR; i++) {
				if (c[i] >= want) {
					if (le[i] == "+Inf") { printf "\">%g\"\n", lo * 1000; exit }
					f = c[i] > below ? (want - below) / (c[i] - below) : 0
					printf "%.3f\n", (lo + f * (le[i] - lo)) * 1000; exit
				}
				lo = le[i]; below = c[i]
			}
		}'
}

wait_for() { # URL: until it answers 2xx, at most 10 s
	for _ in $(seq 100); do
		curl -fs "$1" >/dev/null && return
		sleep 0.1
	done
	echo "bench-replicas: $1 did not answer" >&2
	exit 1
}

# run_setup NAME INDEX REPLICAS SHARED: one setup on a fresh fleet and fresh ports;
# writes $work/NAME.json.
run_setup() {
	local name=$1 idx=$2 n=$3 shared=$4
	local off=$((BASE_PORT + 100 * idx))
	local sims=("127.0.0.1:$((off + 1))" "127.0.0.1:$((off + 2))" "127.0.0.1:$((off + 3))")
	local lb=$((off + 30)) stats=$((off + 31)) redis=$((off + 5))
	local dir="$work/$name" i
	mkdir -p "$dir"
	echo "== $name: $n replica(s)$([ "$shared" = 1 ] && echo ", shared state through redis-server 127.0.0.1:$redis")"

	printf 'seed: 3\nservers:\n  - {name: h100, listen: "%s", replicas: 3, gpu: h100, model: %s, modelSize: 8b}\n' \
		"${sims[0]}" "$MODEL" >"$dir/fleet.yaml"
	{
		echo "apiVersion: gateway.kvgate.io/v1alpha1"
		echo "kind: InferenceGatewayConfig"
		echo "metadata: {name: replicas}"
		echo "spec:"
		echo "  schedulers:"
		echo "    - name: llama"
		echo "      modelName: $MODEL"
		echo "      profile: chat"
		echo "      endpoints: [\"${sims[0]}\", \"${sims[1]}\", \"${sims[2]}\"]"
	} >"$dir/kvgate.yaml"
	{
		echo "global"
		echo "  maxconn 8192"
		echo "defaults"
		echo "  timeout connect 2s"
		echo "  timeout client 10m"
		echo "  timeout server 10m"
		echo "frontend fe"
		echo "  mode tcp"
		echo "  bind 127.0.0.1:$lb"
		echo "  default_backend replicas"
		echo "backend replicas"
		echo "  mode tcp"
		echo "  balance roundrobin"
		for ((i = 0; i < n; i++)); do echo "  server $name-$i 127.0.0.1:$((off + 11 + i))"; done
		echo "frontend stats"
		echo "  mode http"
		echo "  bind 127.0.0.1:$stats"
		echo "  stats enable"
		echo "  stats uri /stats"
	} >"$dir/haproxy.cfg"

	bin/kvgate sim --fleet "$dir/fleet.yaml" --log-level warn &
	live+=($!)
	local peerflags=()
	if [ "$shared" = 1 ]; then
		"$REDIS_SERVER" --bind 127.0.0.1 --port "$redis" --save "" --appendonly no --logfile "$dir/redis.log" &
		live+=($!)
		local redis_pid=$!
		for _ in $(seq 100); do
			redis-cli -p "$redis" ping >/dev/null 2>&1 && break
			sleep 0.1
		done
		peerflags=(--shared-state-redis "127.0.0.1:$redis")
	fi
	local rpids=() admins=()
	for ((i = 0; i < n; i++)); do
		bin/kvgate serve --config "$dir/kvgate.yaml" --listen "127.0.0.1:$((off + 11 + i))" \
			--admin-listen "127.0.0.1:$((off + 21 + i))" --replica-name "$name-$i" "${peerflags[@]}" --pre-stop 0s --log-level warn &
		live+=($!)
		rpids+=($!)
		admins+=("http://127.0.0.1:$((off + 21 + i))")
	done
	haproxy -f "$dir/haproxy.cfg" -db &
	live+=($!)
	local lb_pid=$!

	for s in "${sims[@]}"; do wait_for "http://$s/health"; done
	for a in "${admins[@]}"; do wait_for "$a/readyz"; done
	wait_for "http://127.0.0.1:$stats/stats"
	if [ "$shared" = 1 ]; then # every replica hears the others before the trace starts
		for a in "${admins[@]}"; do
			for k in $(seq 101); do
				[ "$(prom_sum "$a/metrics" kvgate_replica_peers)" = $((n - 1)) ] && break
				[ "$k" = 101 ] && { echo "bench-replicas: $a does not see its $((n - 1)) peers" >&2; exit 1; }
				sleep 0.1
			done
		done
	fi

	# Before the trace.
	local t0 cpu0=() hits0=0 q0=0 scr0=() redis_cpu0=0 s a
	for s in "${sims[@]}"; do
		hits0=$(awk -v a="$hits0" -v b="$(prom_sum "http://$s/metrics" vllm:prefix_cache_hits_total)" 'BEGIN { print a + b }')
		q0=$(awk -v a="$q0" -v b="$(prom_sum "http://$s/metrics" vllm:prefix_cache_queries_total)" 'BEGIN { print a + b }')
		scr0+=("$(prom_sum "http://$s/metrics" kvgate_sim_scrapes_total)")
	done
	for p in "${rpids[@]}"; do cpu0+=("$(cpu_s "$p")"); done
	local bk0="" msgs0=()
	if [ "$shared" = 1 ]; then
		redis_cpu0=$(cpu_s "$redis_pid")
		bk0=$(buckets "${admins[@]/%//metrics}")
		for a in "${admins[@]}"; do msgs0+=("$(messages "$a/metrics")"); done
	fi
	t0=$(date +%s.%N)

	local cmd=(bin/kvgate bench --mode live --scenario "$SCENARIO" --quick --requests "$REQUESTS" --rate "$RATE"
		--target "$name=http://127.0.0.1:$lb" --out "$OUT/$name")
	echo "${cmd[*]}" >"$dir/cmd"
	"${cmd[@]}" | tee "$dir/bench.log"

	# After it.
	local t1 hits=0 q=0 scr=() cpu=() reqs=() conns=() redis_cpu=null
	t1=$(date +%s.%N)
	for p in "${rpids[@]}"; do cpu+=("$(cpu_s "$p")"); done
	[ "$shared" = 1 ] && redis_cpu=$(awk -v a="$(cpu_s "$redis_pid")" -v b="$redis_cpu0" 'BEGIN { printf "%.3f", a - b }')
	for i in "${!sims[@]}"; do
		s=${sims[$i]}
		# this scrape counts itself: one less is what the replicas made
		scr+=("$(awk -v a="$(prom_sum "http://$s/metrics" kvgate_sim_scrapes_total)" -v b="${scr0[$i]}" 'BEGIN { print a - b - 1 }')")
		hits=$(awk -v a="$hits" -v b="$(prom_sum "http://$s/metrics" vllm:prefix_cache_hits_total)" 'BEGIN { print a + b }')
		q=$(awk -v a="$q" -v b="$(prom_sum "http://$s/metrics" vllm:prefix_cache_queries_total)" 'BEGIN { print a + b }')
	done
	for a in "${admins[@]}"; do reqs+=("$(prom_sum "$a/metrics" kvgate_requests_total)"); done
	local csv
	csv=$(curl -fsS "http://127.0.0.1:$stats/stats;csv")
	for ((i = 0; i < n; i++)); do
		conns+=("$(awk -F, -v s="$name-$i" '$1 == "replicas" && $2 == s { print $8 }' <<<"$csv")")
	done

	local prop=null msgs=null
	if [ "$shared" = 1 ]; then
		local bk # the run's entries: the buckets after less those before
		bk=$(awk 'NR == FNR { b[$1] = $2; next } { print $1, $2 - b[$1] }' <(echo "$bk0") <(buckets "${admins[@]/%//metrics}"))
		prop=$(jq -n --argjson p50 "$(quantile 0.5 <<<"$bk")" --argjson p99 "$(quantile 0.99 <<<"$bk")" \
			--argjson buckets "$(awk '{ printf "%s{\"le\":\"%s\",\"count\":%s}", (NR > 1 ? "," : "["), $1, $2 } END { print NR ? "]" : "[]" }' <<<"$bk")" \
			'{p50_ms: $p50, p99_ms: $p99, buckets: $buckets}')
		msgs=$(for i in "${!admins[@]}"; do
			jq -n --argjson a "${msgs0[$i]}" --argjson b "$(messages "${admins[$i]}/metrics")" \
				'$b | with_entries(.value -= ($a[.key] // 0))'
		done | jq -s .)
	fi

	local res="$OUT/$name/results.json"
	jq -n --arg name "$name" --argjson replicas "$n" --argjson shared "$([ "$shared" = 1 ] && echo true || echo false)" \
		--arg command "$(cat "$dir/cmd")" \
		--argjson bench "$(jq '.[0]' "$res")" \
		--argjson window "$(awk -v a="$t1" -v b="$t0" 'BEGIN { printf "%.2f", a - b }')" \
		--argjson hits "$(awk -v a="$hits" -v b="$hits0" 'BEGIN { print a - b }')" \
		--argjson queries "$(awk -v a="$q" -v b="$q0" 'BEGIN { print a - b }')" \
		--argjson scrapes "[$(IFS=,; echo "${scr[*]}")]" \
		--argjson cpu0 "[$(IFS=,; echo "${cpu0[*]}")]" --argjson cpu1 "[$(IFS=,; echo "${cpu[*]}")]" \
		--argjson reqs "[$(IFS=,; echo "${reqs[*]}")]" --argjson conns "[$(IFS=,; echo "${conns[*]}")]" \
		--argjson redis_cpu "$redis_cpu" --argjson prop "$prop" --argjson msgs "$msgs" '
		{setup: $name, replicas: $replicas, shared_state: $shared, command: $command, window_s: $window,
		 ttft_ms: {p50: $bench.ttft_p50_ms, p95: $bench.ttft_p95_ms, p99: $bench.ttft_p99_ms},
		 requests: $bench.requests, errors: $bench.errors,
		 client_prefix_hit_rate: $bench.prefix_hit_rate,
		 server_prefix_cache: {hit_tokens: $hits, query_tokens: $queries,
		   hit_rate: (if $queries > 0 then $hits / $queries else null end)},
		 scrapes_per_s_per_server: [$scrapes[] / $window],
		 replica_cpu_s: [range($cpu1 | length) as $i | ($cpu1[$i] - $cpu0[$i]) * 1000 | round / 1000],
		 replica_requests: $reqs, replica_connections: $conns,
		 redis_cpu_s: $redis_cpu, propagation: $prop, replica_messages: $msgs}' >"$work/$name.json"

	# The replicas and haproxy first, so that no replica sees its Redis go away.
	for p in "${rpids[@]}" "$lb_pid"; do kill "$p" 2>/dev/null || true; done
	for p in "${rpids[@]}" "$lb_pid"; do wait "$p" 2>/dev/null || true; done
	for p in "${live[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	live=()
}

run_setup one 0 1 0
run_setup shared 1 3 1
run_setup alone 2 3 0

elapsed=$(($(date +%s) - started))
for s in "${SETUPS[@]}"; do cat "$work/$s.json"; done |
	jq -s --arg date "$(date -u +%FT%TZ)" --arg commit "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)" \
		--arg machine "$(uname -srm), $(nproc) cores, $(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo)" \
		--argjson elapsed "$elapsed" --arg scenario "$SCENARIO" --argjson requests "$REQUESTS" --argjson rate "$RATE" \
		'{date: $date, commit: $commit, machine: $machine, elapsed_s: $elapsed,
		  scenario: $scenario, requests: $requests, rate: $rate, setups: .}' >"$OUT/results.json"

jq -r --arg out "$OUT" '
	def f(x; d): if x == null then "–" elif (x | type) == "string" then x else (x * pow(10; d) | round) / pow(10; d) | tostring end;
	def pct(x): if x == null then "–" else f(x * 100; 1) + "%" end;
	def what: if .shared_state then "3 replicas, shared state" elif .replicas > 1 then "3 replicas, no sharing" else "1 replica" end;
	def sum(xs): reduce xs[] as $x (0; . + $x);
	"# kvgate serve replicas, live\n",
	"Generated \(.date) on \(.machine), at commit \(.commit); the script took \(.elapsed_s) s.\n",
	"Command: `OUT=\($out) REQUESTS=\(.requests) RATE=\(.rate) SCENARIO=\(.scenario) hack/bench-replicas.sh` (`make bench-replicas` with those values).\n",
	"A simulated fleet of 3 H100 servers of Llama-3.1-8B (`kvgate sim --fleet`), fresh for each setup (cold caches); the first \(.requests) requests of the aws suite'"'"'s \(.scenario) trace at \(.rate) requests/s, open loop (`kvgate bench --mode live`; workload in `<setup>/report.md`), through haproxy (mode tcp, balance roundrobin: each connection goes to the next replica) in front of the replicas; one InferenceGatewayConfig, the chat profile, for all.\n",
	"Prefix-cache hit rate: `vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total` (tokens) over the run, the 3 servers summed (the client'"'"'s view, `cached_tokens` / prompt tokens, in brackets). Scrapes: `kvgate_sim_scrapes_total` over the run, per second, averaged over the 3 servers. CPU: utime + stime of the replicas over the run, summed.\n",
	"The bench client (Go'"'"'s http.Transport) opens a connection for each request in flight that finds none idle and keeps it, reusing the most recently freed one: haproxy spreads the connections evenly, the requests less so (per replica below).\n",
	"| setup | TTFT p50 / p95 / p99 (ms) | errors | prefix-cache hit rate | scrapes/s per model server | CPU s, all replicas | run (s) |",
	"|---|--:|--:|--:|--:|--:|--:|",
	(.setups[] | "| \(.setup): \(what) | \(f(.ttft_ms.p50; 1)) / \(f(.ttft_ms.p95; 1)) / \(f(.ttft_ms.p99; 1)) | \(.errors) of \(.requests) | \(pct(.server_prefix_cache.hit_rate)) (\(pct(.client_prefix_hit_rate))) | \(f(sum(.scrapes_per_s_per_server) / (.scrapes_per_s_per_server | length); 1)) | \(f(sum(.replica_cpu_s); 2)) | \(f(.window_s; 1)) |"),
	"",
	(.setups[] |
		"## \(.setup): \(what)\n",
		"`\(.command)`\n",
		"| | " + ([range(.replicas) as $i | "replica \($i)"] | join(" | ")) + " |",
		"|---|" + ([range(.replicas) | "--:"] | join("|")) + "|",
		"| CPU s | " + ([.replica_cpu_s[] | f(.; 2)] | join(" | ")) + " |",
		"| requests | " + ([.replica_requests[] | f(.; 0)] | join(" | ")) + " |",
		"| connections (haproxy) | " + ([.replica_connections[] | f(.; 0)] | join(" | ")) + " |",
		(if .shared_state then
			(.replica_messages[0] | keys) as $ks | .replica_messages as $m |
			($ks[] as $k | "| messages `\($k)` during the run | " + ([$m[] | .[$k] // 0 | tostring] | join(" | ")) + " |")
		else empty end),
		"",
		"Scrapes per second at each model server: " + ([.scrapes_per_s_per_server[] | f(.; 1)] | join(", ")) + ".",
		(if .shared_state then
			"\nPropagation (`kvgate_replica_propagation_seconds`, the 3 replicas'"'"' buckets summed, interpolated within a bucket): p50 \(f(.propagation.p50_ms; 2)) ms, p99 \(f(.propagation.p99_ms; 2)) ms over the \(.propagation.buckets[-1].count) stream entries (decisions, loads, scrape results, ejections) the replicas applied during the run; buckets (le: cumulative count) " + ([.propagation.buckets[] | "\(.le): \(.count)"] | join(", ")) + ". redis-server used \(f(.redis_cpu_s; 2)) CPU s."
		else empty end),
		"")
' "$OUT/results.json" >"$OUT/report.md"
cat "$OUT/report.md"
