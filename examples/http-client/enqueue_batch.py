#!/usr/bin/env python3
"""Enqueue many tasks through the Tenax HTTP API in batches, and print the rate.

Standard library only. Sends `POST /v1/tasks/batch` requests of up to 1,000 tasks over
one keep-alive connection, one after another, each task numbered `PREFIX-N` so that a
batch sent again (after a 429 or a 503) makes no task twice. Settings come from the
environment:
  TENAX_URL    the API's base URL (default http://127.0.0.1:8080)
  TENAX_TOKEN  a bearer token with role enqueue or admin (omit when the server has none)

Usage: enqueue_batch.py [--tasks N] [--batch N] [--type TYPE] [--queue QUEUE]
                        [--prefix PREFIX] [--atomic]
"""
import argparse
import http.client
import json
import os
import sys
import time
import urllib.parse
import uuid

BASE = os.environ.get("TENAX_URL", "http://127.0.0.1:8080").rstrip("/")
TOKEN = os.environ.get("TENAX_TOKEN")


class Api:
    """One keep-alive connection to the API, opened again if the server closes it."""

    def __init__(self, base):
        url = urllib.parse.urlsplit(base)
        self.https = url.scheme == "https"
        self.host = url.hostname or "127.0.0.1"
        self.port = url.port or (443 if self.https else 80)
        self.prefix = url.path.rstrip("/")
        self.conn = None
        self.headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if TOKEN:
            self.headers["Authorization"] = "Bearer " + TOKEN

    def _connect(self):
        kind = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
        self.conn = kind(self.host, self.port, timeout=120)

    def post(self, path, body, attempts=5):
        """POST a JSON body; 429 and 503 are retried after their Retry-After."""
        data = json.dumps(body, separators=(",", ":")).encode()
        for attempt in range(attempts):
            if self.conn is None:
                self._connect()
            try:
                self.conn.request("POST", self.prefix + path, body=data, headers=self.headers)
                response = self.conn.getresponse()
                answer = json.loads(response.read() or b"null")
            except (http.client.HTTPException, ConnectionError):
                # The server closed an idle connection: open another and send again
                # (the task numbers make a repeat harmless).
                self.conn.close()
                self.conn = None
                if attempt + 1 < attempts:
                    continue
                raise
            if response.status in (429, 503) and attempt + 1 < attempts:
                time.sleep(int(response.getheader("Retry-After", "1")))
                continue
            return response.status, answer
        sys.exit("gave up")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=100_000, help="tasks to enqueue")
    parser.add_argument("--batch", type=int, default=1000, help="tasks per request")
    parser.add_argument("--type", default="NOOP", help="command type of every task")
    parser.add_argument("--queue", default="default", help="queue of every task")
    parser.add_argument("--prefix", default=None, help="task number prefix (default: random)")
    parser.add_argument("--atomic", action="store_true", help="each batch all or nothing")
    args = parser.parse_args()
    prefix = args.prefix or uuid.uuid4().hex[:12]
    api = Api(BASE)
    created = existing = failed = 0
    started = time.perf_counter()
    for start in range(0, args.tasks, args.batch):
        tasks = [
            {"command_type": args.type, "queue": args.queue,
             "task_no": f"{prefix}-{n}", "payload": {"n": n}}
            for n in range(start, min(start + args.batch, args.tasks))
        ]
        status, answer = api.post("/v1/tasks/batch", {"tasks": tasks, "atomic": args.atomic})
        if status != 200:
            error = (answer or {}).get("error", {})
            for item in error.get("items", [])[:5]:
                print(f"  task {start + item['index']}: {item['code']} {item['message']}",
                      file=sys.stderr)
            sys.exit(f"error {status} {error.get('code')}: {error.get('message')}")
        for result in answer["results"]:
            if result["status"] == 201:
                created += 1
            elif result["status"] == 200:
                existing += 1
            else:
                failed += 1
                if failed <= 5:
                    error = result["error"]
                    print(f"  task {start + result['index']}: {result['status']} "
                          f"{error['code']} {error['message']}", file=sys.stderr)
    elapsed = time.perf_counter() - started
    print(f"{args.tasks} tasks in {elapsed:.3f} s: {args.tasks / elapsed:,.0f} tasks/s "
          f"({created} new, {existing} existing, {failed} refused; batches of {args.batch})")
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
