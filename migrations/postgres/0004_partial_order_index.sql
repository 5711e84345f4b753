-- At most one payment entry per order, held by a partial unique index instead of the
-- UNIQUE constraint of 0003: the constraint's index held an entry for every ledger entry,
-- NULL order_id included (a withdrawal, a deposit, a draw), so every spend paid for one
-- more index insertion than the rule needs. The index keeps the constraint's name, which
-- a violation reports, so the error it maps to is unchanged.

ALTER TABLE entries DROP CONSTRAINT entries_one_payment_per_order;
CREATE UNIQUE INDEX entries_one_payment_per_order ON entries (order_id)
    WHERE order_id IS NOT NULL;
