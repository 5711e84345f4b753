-- Spends in one round trip, and many spends in one transaction (the ledger's group commit,
-- ledger/src/batch.rs). `apply_spends` takes a batch of spends as parallel arrays and,
-- for each in turn, does what the ledger's transaction does on its usual path: judge the
-- locked ticket by the database's clock, move money and points with the conditional
-- UPDATE that checks and records the fencing token, write the entry and store the
-- outcome under the ticket. Called as one statement, it is one implicit transaction.
--
-- It writes only spends that go through. A spend it does not write (unknown or used
-- ticket, expired, refused by funds, points or the fencing check) writes nothing and
-- comes back with its ticket as found, so one spend's refusal never rolls back another's:
-- the caller answers a used ticket from the row and settles a refusal on the ledger's
-- transaction path, which judges everything again.
--
-- Deadlocks: every writer of the ledger locks tickets before accounts, tickets in id
-- order and accounts in the order the caller sorted the batch by (account id). So this
-- function locks all its tickets first, in id order, and the caller sorts spends by
-- account; the transaction path locks one ticket, then one account.
--
-- The stored body arrives rendered with stand-in numbers where the balance and points
-- after the spend go (the caller checked that they appear nowhere else); they are
-- replaced by what the UPDATE returned.
CREATE FUNCTION apply_spends(
    ticket_ids       UUID[],
    account_ids      UUID[],
    kinds            TEXT[],
    debits           BIGINT[],
    credits          BIGINT[],
    spent_points     BIGINT[],
    tokens           BIGINT[],
    fingerprints     TEXT[],
    bodies           TEXT[],
    balance_stand_in TEXT,
    points_stand_in  TEXT
) RETURNS TABLE (
    applied         BOOLEAN,
    id              UUID,
    account_id      UUID,
    created_at      TIMESTAMPTZ,
    expires_at      TIMESTAMPTZ,
    operation       TEXT,
    fingerprint     TEXT,
    response_status INTEGER,
    response_body   JSON,
    completed_at    TIMESTAMPTZ,
    read_at         TIMESTAMPTZ
) LANGUAGE plpgsql AS $$
DECLARE
    i             INTEGER;
    ticket        tickets%ROWTYPE;
    found_ticket  BOOLEAN;
    balance_after BIGINT;
    points_after  BIGINT;
BEGIN
    PERFORM 1 FROM tickets AS t WHERE t.id = ANY (ticket_ids) ORDER BY t.id FOR UPDATE;
    FOR i IN 1 .. coalesce(cardinality(ticket_ids), 0) LOOP
        SELECT * INTO ticket FROM tickets AS t WHERE t.id = ticket_ids[i];
        found_ticket := FOUND;
        -- Read after every lock this spend waits for, as the transaction path reads it.
        read_at := clock_timestamp();
        applied := false;
        IF found_ticket AND ticket.account_id = account_ids[i]
           AND ticket.completed_at IS NULL AND ticket.expires_at > read_at THEN
            UPDATE accounts AS a
            SET balance = a.balance - debits[i] + credits[i],
                points = a.points - spent_points[i],
                fencing_token = tokens[i]
            WHERE a.id = account_ids[i] AND a.fencing_token < tokens[i]
              AND a.balance >= debits[i] AND a.points >= spent_points[i]
              AND a.balance - debits[i] <= 9223372036854775807 - credits[i]
            RETURNING a.balance, a.points INTO balance_after, points_after;
            IF FOUND THEN
                INSERT INTO entries (account_id, ticket_id, kind, amount, points, balance_after,
                                     points_after, fencing_token, created_at)
                VALUES (account_ids[i], ticket_ids[i], kinds[i], credits[i] - debits[i],
                        -spent_points[i], balance_after, points_after, tokens[i], read_at);
                UPDATE tickets AS t
                SET operation = kinds[i], fingerprint = fingerprints[i], response_status = 201,
                    response_body = replace(replace(bodies[i], balance_stand_in, balance_after::text),
                                            points_stand_in, points_after::text)::json,
                    completed_at = read_at
                WHERE t.id = ticket_ids[i]
                RETURNING t.* INTO ticket;
                applied := true;
            END IF;
        END IF;
        IF found_ticket THEN
            id := ticket.id;
            account_id := ticket.account_id;
            created_at := ticket.created_at;
            expires_at := ticket.expires_at;
            operation := ticket.operation;
            fingerprint := ticket.fingerprint;
            response_status := ticket.response_status;
            response_body := ticket.response_body;
            completed_at := ticket.completed_at;
        ELSE
            id := NULL;
            account_id := NULL;
            created_at := NULL;
            expires_at := NULL;
            operation := NULL;
            fingerprint := NULL;
            response_status := NULL;
            response_body := NULL;
            completed_at := NULL;
        END IF;
        RETURN NEXT;
    END LOOP;
END
$$;
