-- The same as migrations/postgres/0006_creations.sql, in SQLite's types.

CREATE TABLE creations (
    key_hash        BLOB PRIMARY KEY NOT NULL,
    fingerprint     TEXT NOT NULL,
    created_account BLOB REFERENCES accounts (id) DEFERRABLE INITIALLY DEFERRED,
    created_order   BLOB REFERENCES orders (id) DEFERRABLE INITIALLY DEFERRED,
    response_status INTEGER NOT NULL,
    response_body   TEXT NOT NULL,
    sealed_api_key  BLOB,
    created_at      INTEGER NOT NULL,
    CONSTRAINT creations_one_thing_created
        CHECK ((created_account IS NULL) <> (created_order IS NULL)),
    CONSTRAINT creations_api_key_iff_account
        CHECK ((sealed_api_key IS NULL) = (created_account IS NULL))
);

CREATE INDEX creations_to_reap ON creations (created_at);
