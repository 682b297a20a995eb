#!/usr/bin/env python3
"""Interop check: the official Python client `ratelimitly==2.0.0` (PyPI) against our
`rl-responder` binary, in cookie and aes modes.

Installs nothing: run `pip install ratelimitly==2.0.0` yourself first.

Usage: interop.py [PATH_TO_rl-responder]   (or env RL_RESPONDER_BIN; default
target/debug/rl-responder). Starts the binary with the key in RATELIMITLY_API_KEY (never on
the command line) and its hidden `--dns-domain` option, which serves discovery DNS and
prints `{"event":"dns_ready","port":N}`. The client discovers the server through that DNS
(SRV, then A via the same server, through the client's `resolver=` hook, because the
package resolves A/AAAA through the OS). Prints `N passed, N failed`; exits 1 on failure.
"""

import json
import os
import select
import signal
import socket
import subprocess
import sys
import time

from ratelimitly import (
    RCLIENT_OK,
    RateLimitlyClient,
    ResourceRequest,
    r_client_derive_bucket_id,
)
from ratelimitly.discovery import ServerEndpoint, server_id_from_target
from ratelimitly.policy import FixedSchedule, RequestPolicy

# Public test fixtures (not real credentials): the repository's tests/data/vectors.json.
_VECTORS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "vectors.json")
with open(_VECTORS) as _f:
    _FIXTURES = {k["name"]: k["key"] for k in json.load(_f)["keys_valid"]}
KEYS = {
    "cookie": _FIXTURES["cookie_key_id_2"],
    "aes": _FIXTURES["aes_key_id_3"],
}
DOMAIN = "py-interop.test"
SERVER_ID = 777

passed = 0
failed = 0


def check(cond, what):
    global passed, failed
    if cond:
        passed += 1
    else:
        failed += 1
        print(f"FAIL: {what}", file=sys.stderr)


def read_json_line(proc, deadline):
    buf = b""
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.1)
        if not ready:
            if proc.poll() is not None:
                break
            continue
        ch = os.read(proc.stdout.fileno(), 1)
        if not ch:
            break
        if ch == b"\n":
            return json.loads(buf.decode())
        buf += ch
    raise RuntimeError("rl-responder printed no JSON line in time")


def make_resolver(dns_port, fallback):
    """SRV and A from our DNS responder on 127.0.0.1:dns_port (dnspython, installed with
    the ratelimitly package); falls back to the ready line's address without it."""

    def resolve(dns_srv):
        try:
            import dns.resolver  # type: ignore

            r = dns.resolver.Resolver(configure=False)
            r.nameservers = ["127.0.0.1"]
            r.port = dns_port
            r.lifetime = 2.0
            out = []
            for srv in r.resolve(f"_ratelimitly._udp.{dns_srv}", "SRV"):
                target = str(srv.target).rstrip(".")
                sid = server_id_from_target(target)
                if sid is None:
                    continue
                for a in r.resolve(target, "A"):
                    out.append(ServerEndpoint(socket.AF_INET, (str(a), int(srv.port)), sid, target, 30_000))
            return out
        except ImportError:
            return [fallback]

    return resolve


def run_mode(binary, mode):
    env = dict(os.environ, RATELIMITLY_API_KEY=KEYS[mode])
    proc = subprocess.Popen(
        [binary, "--server-id", str(SERVER_ID), "--dns-domain", DOMAIN],
        stdout=subprocess.PIPE,
        env=env,
    )
    try:
        deadline = time.monotonic() + 10
        ready = read_json_line(proc, deadline)
        check(ready.get("event") == "ready" and ready.get("server_id") == SERVER_ID, f"{mode}: ready line {ready}")
        dns_ready = read_json_line(proc, deadline)
        check(dns_ready.get("event") == "dns_ready", f"{mode}: dns_ready line")
        fallback = ServerEndpoint(socket.AF_INET, (ready["address"], ready["port"]), SERVER_ID, "s-777", 30_000)
        # U = 100 ms (H = 300 ms, the fixture keys' dedup limit) instead of the default 20 ms:
        # on a loaded 2-core CI machine the first answer can take longer than a 60 ms
        # horizon; a replay carries the same unique id, so the server counts it once.
        policy = RequestPolicy(unit_ms=100, replay_count=1, replay_gap=FixedSchedule(1))
        client = RateLimitlyClient(
            KEYS[mode], dns_srv=DOMAIN, policy=policy, resolver=make_resolver(dns_ready["port"], fallback)
        )
        bucket = r_client_derive_bucket_id("py-checkout", 60_000, 5)
        one = ResourceRequest(bucket, 60_000, 5, 1)
        for i in range(1, 6):
            rc, res = client.check_rate_limit([one])
            check(rc == RCLIENT_OK and res is not None and res.success, f"{mode}: grant {i} (rc {rc})")
            if res is not None:
                check(res.server_id == SERVER_ID, f"{mode}: server id {res.server_id}")
                check(res.resources[0].actual_rate == i, f"{mode}: actual_rate {res.resources[0].actual_rate} != {i}")
        rc, res = client.check_rate_limit([ResourceRequest(bucket, 60_000, 5, 2)])
        check(rc == RCLIENT_OK and res is not None and not res.success, f"{mode}: rejection (rc {rc})")
        if res is not None:
            check(res.resources[0].tokens_deficit == 2, f"{mode}: deficit {res.resources[0].tokens_deficit} != 2")
        client.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = None
        check(rc == 0, f"{mode}: responder exit status {rc} on SIGTERM")


def main():
    binary = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("RL_RESPONDER_BIN", "target/debug/rl-responder")
    for mode in ("cookie", "aes"):
        try:
            run_mode(binary, mode)
        except Exception as e:  # noqa: BLE001 - any failure counts
            check(False, f"{mode}: {type(e).__name__}: {e}")
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
