-- Room in each tickets page for every ticket's outcome. 0001 left 30% of a page free so
-- that using a ticket would be a heap-only tuple (HOT) update, but a used ticket is about
-- 270 bytes against 80 unused: a page filled to 70% had room for about one in eight of
-- its tickets' outcomes, and the rest moved to other pages, each adding an entry to both
-- of the table's indexes (in the ledger benchmark, 35% of uses were HOT). Filled to 20%,
-- a page holds about 19 tickets and room for all their outcomes (100% HOT in the same
-- benchmark). The price: a page of unused tickets holds 19 where it held 68; once they are
-- used it is about two-thirds full, as pages filled at 70% were. Only pages filled from
-- now on change.
ALTER TABLE tickets SET (fillfactor = 20);
