-- Creates sent with an `Idempotency-Key`: one row per key, holding the first answer, so a
-- repeat of the same request answers it again and another request under the key is
-- refused. Written in the transaction that creates the account or order it announces;
-- deleted by the reaper once older than the retention.
--
-- The client's key is not stored: `key_hash` is SHA-256 of the key's scope (the account
-- for orders, the client address for accounts) and the key. An account's API key is
-- stored only sealed: XORed with a pad derived from the client's idempotency key, which
-- the database never sees (see ledger/src/creates.rs).

CREATE TABLE creations (
    key_hash        BYTEA PRIMARY KEY,
    -- The request's fingerprint (method, path, canonical body).
    fingerprint     TEXT NOT NULL,
    -- What the create made: an account or an order. Deferred: the row claims its key
    -- before the account or order is written, in the same transaction.
    created_account UUID REFERENCES accounts (id) DEFERRABLE INITIALLY DEFERRED,
    created_order   UUID REFERENCES orders (id) DEFERRABLE INITIALLY DEFERRED,
    response_status INTEGER NOT NULL,
    -- JSON, not JSONB: stored and replayed as written, never queried. An account's
    -- answer is stored without its API key.
    response_body   JSON NOT NULL,
    -- An account create's API key, sealed; NULL for an order.
    sealed_api_key  BYTEA,
    created_at      TIMESTAMPTZ NOT NULL,
    CONSTRAINT creations_one_thing_created
        CHECK ((created_account IS NULL) <> (created_order IS NULL)),
    CONSTRAINT creations_api_key_iff_account
        CHECK ((sealed_api_key IS NULL) = (created_account IS NULL))
);

-- The reaper's scan.
CREATE INDEX creations_to_reap ON creations (created_at);
