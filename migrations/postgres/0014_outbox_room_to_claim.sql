-- Room in each outbox page for its jobs' claims. A claim changes no indexed column (it
-- counts the attempt and takes the lease), so it can be a heap-only tuple (HOT) update —
-- but only where the page has room for the new version. The outbox was filled to 100%:
-- every claim moved its row to another page and added an entry to each of the table's
-- indexes, work a recording then did again. Filled to 70%, a page keeps room for its rows'
-- claims. Only pages filled from now on change.
ALTER TABLE outbox SET (fillfactor = 70);
