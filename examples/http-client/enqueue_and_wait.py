#!/usr/bin/env python3
"""Enqueue an `echo` task through the Tenax HTTP API, wait for it, print its result.

Standard library only. Settings come from the environment:
  TENAX_URL    the API's base URL (default http://127.0.0.1:8080)
  TENAX_TOKEN  a bearer token with role enqueue or admin (omit when the server has none)

Usage: enqueue_and_wait.py [MESSAGE]
"""
import json
import os
import sys
import time
import urllib.error
import urllib.request

BASE = os.environ.get("TENAX_URL", "http://127.0.0.1:8080").rstrip("/")
TOKEN = os.environ.get("TENAX_TOKEN")


def call(method, path, body=None, attempts=5):
    """One API call; 429 and 503 are retried after their Retry-After."""
    data = None if body is None else json.dumps(body).encode()
    for attempt in range(attempts):
        request = urllib.request.Request(BASE + path, data=data, method=method)
        request.add_header("Accept", "application/json")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        if TOKEN:
            request.add_header("Authorization", "Bearer " + TOKEN)
        try:
            with urllib.request.urlopen(request, timeout=90) as response:
                return response.status, json.load(response)
        except urllib.error.HTTPError as e:
            error = json.load(e).get("error", {})
            if e.code in (429, 503) and attempt + 1 < attempts:
                time.sleep(int(e.headers.get("Retry-After", "1")))
                continue
            sys.exit(f"error {e.code} {error.get('code')}: {error.get('message')}")
    sys.exit("gave up")


def main():
    message = sys.argv[1] if len(sys.argv) > 1 else "hello from python"
    status, task = call("POST", "/v1/tasks", {"command_type": "echo", "payload": {"message": message}})
    print(f"enqueued task {task['id']} ({'new' if status == 201 else 'existing'})", file=sys.stderr)
    while True:
        # Returns as soon as the task is finished, or after 30 s with finished = false.
        _, waited = call("GET", f"/v1/tasks/{task['id']}/wait?timeout_ms=30000")
        if waited["finished"]:
            break
    task = waited["task"]
    if task["status"] != "succeeded":
        sys.exit(f"task {task['id']} ended {task['status']}: {task['last_error']}")
    print(json.dumps(task["result"], sort_keys=True))


if __name__ == "__main__":
    main()
