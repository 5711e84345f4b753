-- The webhook endpoints' POSTs sent with an `Idempotency-Key` — an endpoint's creation, a
-- rotation of its secret, a delivery sent again by hand: one row per key, holding the first
-- answer, written in the transaction of what it answers, so a repeat of the same request
-- answers it again (a rotation sent twice rotates once) and another request under the key
-- is refused. As `creations` does for accounts and orders; deleted by the reaper once older
-- than the retention.
--
-- The client's key is not stored: `key_hash` is SHA-256 of the account and the key. A
-- secret the answer showed (the endpoint's, or the rotation's new one) is stored only
-- sealed: XORed with a pad derived from the client's key and `request_id`, a fresh id per
-- record (see ledger/src/requests.rs).
CREATE TABLE webhook_requests (
    key_hash        BYTEA PRIMARY KEY,
    -- The request's fingerprint (method, path, canonical body).
    fingerprint     TEXT NOT NULL,
    request_id      UUID NOT NULL,
    response_status INTEGER NOT NULL,
    -- JSON, not JSONB: stored and replayed as written; without the secret.
    response_body   JSON NOT NULL,
    sealed_secret   BYTEA,
    created_at      TIMESTAMPTZ NOT NULL
);

-- The reaper's scan.
CREATE INDEX webhook_requests_to_reap ON webhook_requests (created_at);
