#!/bin/sh
# Enqueue an `echo` task through the Tenax HTTP API with curl, wait for it, print its
# result. Settings come from the environment:
#   TENAX_URL    the API's base URL (default http://127.0.0.1:8080)
#   TENAX_TOKEN  a bearer token with role enqueue or admin (omit when the server has none)
# Usage: enqueue_and_wait.sh [MESSAGE]   (a plain message: letters, digits, spaces)
# Only curl and sed are needed; with jq, read fields with `jq -r .id` instead of sed.
set -eu

URL="${TENAX_URL:-http://127.0.0.1:8080}"
MESSAGE="${1:-hello from curl}"

api() {
    # api METHOD PATH [BODY]: the response body on stdout; exit with it on a 4xx/5xx.
    if [ -n "${TENAX_TOKEN:-}" ]; then
        set -- "$@" -H "Authorization: Bearer $TENAX_TOKEN"
    fi
    method=$1 path=$2
    shift 2
    if [ "${1:-}" != "" ] && [ "${1#-}" = "$1" ]; then
        body=$1
        shift
        curl -sS --fail-with-body -X "$method" -H 'Content-Type: application/json' \
            --data "$body" "$@" "$URL$path"
    else
        curl -sS --fail-with-body -X "$method" "$@" "$URL$path"
    fi
}

task=$(api POST /v1/tasks "{\"command_type\":\"echo\",\"payload\":{\"message\":\"$MESSAGE\"}}")
id=$(printf '%s' "$task" | sed -n 's/^{"id":\([0-9]*\),.*/\1/p')
[ -n "$id" ] || { echo "unexpected answer: $task" >&2; exit 1; }
echo "enqueued task $id" >&2

while :; do
    # Returns as soon as the task is finished, or after 30 s with "finished":false.
    waited=$(api GET "/v1/tasks/$id/wait?timeout_ms=30000")
    case $waited in
        '{"finished":true'*) break ;;
    esac
done
case $waited in
    *'"status":"succeeded"'*) ;;
    *) echo "task $id did not succeed: $waited" >&2; exit 1 ;;
esac
printf '%s\n' "$waited" | sed -n 's/.*"result":\({[^}]*}\).*/\1/p'
