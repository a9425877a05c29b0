#!/usr/bin/env bash
# Schemathesis against the OpenAPI document of a real `tenax serve` (SQLite, an admin
# token): every operation gets generated requests, valid and invalid, and every answer
# must be no 5xx, conform to its documented schema, and carry a documented status.
#
#   .ci/schemathesis.sh          100 examples per operation (CI)
#   .ci/schemathesis.sh 1000     the nightly depth
#   TENAX_BIN=target/debug/tenax .ci/schemathesis.sh   serve with a binary already built
#
# Schemathesis (pinned) is installed in a virtualenv next to the build, outside the
# clone when CARGO_TARGET_DIR is set.
set -euo pipefail
cd "$(dirname "$0")/.."

examples=${1:-100}
version=4.32.5
out=${CARGO_TARGET_DIR:-$PWD/target}
venv="$out/schemathesis-$version"

fail() { echo "schemathesis: $*" >&2; exit 1; }

if [ ! -x "$venv/bin/schemathesis" ]; then
    echo "== installing schemathesis $version"
    if ! python3 -m venv "$venv" 2>/dev/null; then
        # Debian ships venv separately.
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv \
            || fail "cannot install python3-venv"
        rm -rf "$venv"
        python3 -m venv "$venv" || fail "cannot make a virtualenv"
    fi
    "$venv/bin/pip" install -q "schemathesis==$version" || fail "cannot install schemathesis"
fi

# TENAX_BIN: a `tenax` binary already built (.ci/test passes the test build's).
tenax=${TENAX_BIN:-}
if [ -z "$tenax" ]; then
    echo "== building tenax"
    cargo build -q -p tenax-cli --all-features --bin tenax
    tenax="$out/debug/tenax"
fi
[ -x "$tenax" ] || fail "no tenax binary at $tenax"

work=$(mktemp -d)
server=""
cleanup() {
    if [ -n "$server" ]; then kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; fi
    rm -rf "$work"
}
trap cleanup EXIT

token="tnx_schemathesis_$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')"
hash=$(printf '%s' "$token" | sha256sum | cut -d' ' -f1)
cat >"$work/tenax.toml" <<TOML
[server]
command_types = ["echo"]
wait_max = "1s"
db_timeout = "5s"
[[server.tokens]]
name = "schemathesis"
role = "admin"
sha256 = "$hash"
[server.secrets]
echo = ["password"]
TOML

TENAX_LOG=warn "$tenax" --config "$work/tenax.toml" --database-url "sqlite://$work/tenax.db" \
    serve --listen 127.0.0.1:0 --poll-interval 50ms >"$work/stdout" 2>"$work/serve.log" &
server=$!
addr=""
for _ in $(seq 1 600); do
    addr=$(sed -n 's|^listening on http://||p' "$work/stdout" | head -n 1)
    [ -n "$addr" ] && break
    kill -0 "$server" 2>/dev/null || { cat "$work/serve.log" >&2; fail "tenax serve exited"; }
    sleep 0.1
done
[ -n "$addr" ] || fail "tenax serve printed no address within 60 s"
echo "== schemathesis: $examples examples per operation against http://$addr/openapi.json"

status=0
# From the scratch folder: Schemathesis keeps a cache in the current one.
cd "$work"
"$venv/bin/schemathesis" run "http://$addr/openapi.json" \
    --header "Authorization: Bearer $token" \
    --checks not_a_server_error,response_schema_conformance,status_code_conformance,content_type_conformance \
    --max-examples "$examples" \
    --phases examples,coverage,fuzzing,stateful \
    --request-timeout 10 \
    --seed 1 \
    --workers 2 \
    --suppress-health-check too_slow,filter_too_much \
    2>&1 | tee "$work/run.log" || status=$?

# The counts: test cases sent (each one request, more in stateful sequences), failures.
cases=$(sed -n 's/^ *\([0-9][0-9]*\) generated.*/\1/p' "$work/run.log" | tail -n 1)
failures=$(sed -n 's/.* \([0-9][0-9]*\) found .*/\1/p' "$work/run.log" | tail -n 1)
echo "schemathesis: ${cases:-?} test cases sent (${examples} examples per operation), ${failures:-0} failing"
if grep -q "panicked at" "$work/serve.log"; then
    grep -m 5 "panicked at" "$work/serve.log" >&2
    fail "the server panicked"
fi
if grep -qF "$token" "$work/serve.log"; then
    fail "the token is in the server's log"
fi
[ "$status" -eq 0 ] || fail "failures found (exit $status)"
echo "schemathesis: 5xx 0, schema violations 0, undocumented status codes 0"
