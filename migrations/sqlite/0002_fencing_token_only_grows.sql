-- The same rule as migrations/postgres/0002_fencing_token_only_grows.sql, in SQLite's
-- syntax: an UPDATE that would lower an account's recorded fencing token fails.

CREATE TRIGGER accounts_fencing_token_only_grows BEFORE UPDATE ON accounts
WHEN NEW.fencing_token < OLD.fencing_token
BEGIN
    SELECT RAISE(ABORT, 'the fencing token of an account only grows');
END;
