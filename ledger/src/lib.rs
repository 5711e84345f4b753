//! The ledger: accounts, tickets and entries, and the one transaction that applies an
//! operation. (Being built; see the issue tracker.)
