"""A runner process that registers and claims an operation, then hangs until killed.

Used by the SIGKILL test: ``python crashing_runner.py BASE_URL TOKEN TOOL LEASE_S``.
It prints one JSON line with the operation id and the attempt once the claim is
committed, then sleeps as if it were calling the outside world.
"""

import json
import sys
import time

import httpx


def main() -> None:
    base_url, token, tool, lease_s = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    with httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {token}"}) as client:
        run = client.post("/api/v1/runs", json={"principal": "user:alice"}).json()
        op = client.post(
            "/api/v1/operations",
            json={
                "run": run["id"],
                "tool": tool,
                "operation_key": f"crash-{tool}",
                "arguments": {"payment_id": "pay_1", "amount_cents": 100},
            },
        ).json()
        attempt = client.post(
            f"/api/v1/operations/{op['id']}/attempts", json={"lease_s": lease_s}
        ).json()
    print(json.dumps({"operation": op["id"], "attempt": attempt}), flush=True)
    time.sleep(3600)


if __name__ == "__main__":
    main()
