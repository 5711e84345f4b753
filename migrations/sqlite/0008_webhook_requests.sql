-- The same as migrations/postgres/0010_webhook_requests.sql, in SQLite's types.

CREATE TABLE webhook_requests (
    key_hash        BLOB PRIMARY KEY NOT NULL,
    fingerprint     TEXT NOT NULL,
    request_id      BLOB NOT NULL,
    response_status INTEGER NOT NULL,
    response_body   TEXT NOT NULL,
    sealed_secret   BLOB,
    created_at      INTEGER NOT NULL
);

CREATE INDEX webhook_requests_to_reap ON webhook_requests (created_at);
