-- The account's recorded fencing token only grows (DESIGN.md, "Ledger invariants"). The
-- database can hold this invariant itself, so, as 0001_ledger.sql does for the others, it
-- is held here: an UPDATE that would lower it fails. The audit still checks it, for a
-- database changed with triggers disabled.
--
-- The ledger never lowers it: every UPDATE that sets it is conditional on
-- `fencing_token <= new value`, and the demonstration's unguarded write does not touch it.
-- The WHEN condition is checked without calling the function, so an update that keeps or
-- raises the token (every update the ledger makes) pays one comparison for the trigger.

CREATE FUNCTION accounts_fencing_token_only_grows() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'the fencing token of account % only grows: % is below %',
        OLD.id, NEW.fencing_token, OLD.fencing_token
        USING ERRCODE = 'check_violation';
END
$$;

CREATE TRIGGER accounts_fencing_token_only_grows
    BEFORE UPDATE ON accounts
    FOR EACH ROW
    WHEN (NEW.fencing_token < OLD.fencing_token)
    EXECUTE FUNCTION accounts_fencing_token_only_grows();
