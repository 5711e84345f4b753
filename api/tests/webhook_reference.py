"""Verifies payonce's webhook deliveries with the Standard Webhooks reference library for
Python (the `standardwebhooks` package on PyPI). The cases come as JSON in $CASES, from
api/tests/api/webhooks.rs: each a delivery as received (id, timestamp, signature, body),
the secret to verify it with, whether it must verify, and optionally a change to make
first — `tamper` (the body altered) or `age` (signed again, correctly, over a timestamp
that many seconds old, so only the timestamp is wrong). Prints `ok <name>` per case that
came out as expected; exits 1 if any did not."""

import base64
import hashlib
import hmac
import json
import os
import sys
import time

from standardwebhooks.webhooks import Webhook, WebhookVerificationError

failed = 0
for case in json.loads(os.environ["CASES"]):
    received = case["received"]
    body, timestamp, signature = received["body"], received["timestamp"], received["signature"]
    if case.get("tamper"):
        body = body.replace("withdrawal", "withdrawaL", 1)
    if case.get("age"):
        timestamp = str(int(time.time()) - case["age"])
        key = base64.b64decode(case["secret"].removeprefix("whsec_"))
        signed = f"{received['id']}.{timestamp}.{body}".encode()
        digest = hmac.new(key, signed, hashlib.sha256).digest()
        signature = "v1," + base64.b64encode(digest).decode()
    headers = {
        "webhook-id": received["id"],
        "webhook-timestamp": timestamp,
        "webhook-signature": signature,
    }
    try:
        Webhook(case["secret"]).verify(body, headers)
        verified, why = True, "verified"
    except WebhookVerificationError as error:
        verified, why = False, str(error)
    right_reason = not case.get("age") or "timestamp" in why.lower()
    if verified == case["expect"] and right_reason:
        print(f"ok {case['name']} ({why})")
    else:
        print(f"FAILED {case['name']}: expected {case['expect']}, got {verified} ({why})")
        failed += 1
sys.exit(1 if failed else 0)
