-- The list filtered by reference (a caller's view of one payment, under whatever keys it
-- was sent) reads this index instead of every transfer.
CREATE INDEX bank_transfers_reference ON bank_transfers (reference);
