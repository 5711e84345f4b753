//! Requests this instance is executing, by ticket. A duplicate of a request that is still
//! executing waits here, on a local mutex, for the original to finish and then replays
//! its outcome — instead of queueing on the account's lock, where a hundred copies of one
//! request would be a hundred waiters in the lock store. The tickets whose flights ended
//! lately are remembered for a few seconds, so a duplicate arriving just after its
//! original is known as one too: it looks the stored outcome up instead of taking the
//! lock (an original goes straight for the lock, and the ledger judges its ticket).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use ledger::TicketId;
use tokio::sync::OwnedMutexGuard;
use tokio::time::{Instant, timeout_at};

type Flight = Arc<tokio::sync::Mutex<()>>;

/// The flights, one per ticket being executed or waited for.
#[derive(Debug)]
pub struct Flights {
    /// Never held across an await.
    by_ticket: Mutex<HashMap<TicketId, Flight>>,
    /// Tickets whose flight ended in the last [`LANDED_FOR`]. Only a hint of where to
    /// look first: the answer always comes from the ledger.
    landed: moka::sync::Cache<TicketId, ()>,
}

/// How long a landed flight's ticket is remembered.
const LANDED_FOR: Duration = Duration::from_secs(10);

/// How many landed tickets are remembered at most.
const LANDED_CAPACITY: u64 = 100_000;

impl Default for Flights {
    fn default() -> Self {
        Self {
            by_ticket: Mutex::default(),
            landed: moka::sync::Cache::builder()
                .max_capacity(LANDED_CAPACITY)
                .time_to_live(LANDED_FOR)
                .build(),
        }
    }
}

/// A place on a ticket's flight: this request executes the ticket until it drops this.
#[derive(Debug)]
pub struct Boarded<'a> {
    flights: &'a Flights,
    ticket: TicketId,
    guard: Option<OwnedMutexGuard<()>>,
    duplicate: bool,
}

impl Boarded<'_> {
    /// Whether another request of this instance held the ticket first, or lately: its
    /// outcome is likely stored, so look it up before asking for the lock.
    pub fn duplicate(&self) -> bool {
        self.duplicate
    }
}

impl Drop for Boarded<'_> {
    fn drop(&mut self) {
        self.flights.landed.insert(self.ticket, ());
        drop(self.guard.take());
        self.flights.leave(self.ticket);
    }
}

/// A waiter that has not boarded yet: leaves the map tidy however its wait ends.
struct Waiting<'a> {
    flights: &'a Flights,
    ticket: TicketId,
    flight: Option<Flight>,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        drop(self.flight.take());
        self.flights.leave(self.ticket);
    }
}

impl Flights {
    fn map(&self) -> MutexGuard<'_, HashMap<TicketId, Flight>> {
        // Inserts and removes cannot leave the map inconsistent.
        self.by_ticket
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Boards `ticket`'s flight: at once when no other request of this instance holds
    /// it, else once the one ahead has finished — or `None` at `deadline`.
    pub async fn board(&self, ticket: TicketId, deadline: Instant) -> Option<Boarded<'_>> {
        let flight = self.map().entry(ticket).or_default().clone();
        let mut waiting = Waiting {
            flights: self,
            ticket,
            flight: Some(flight.clone()),
        };
        let (guard, waited) = match flight.clone().try_lock_owned() {
            Ok(guard) => (guard, false),
            Err(_) => (timeout_at(deadline, flight.lock_owned()).await.ok()?, true),
        };
        let duplicate = waited || self.landed.contains_key(&ticket);
        // The guard now keeps the flight alive; `waiting` lets go of its own reference.
        drop(waiting.flight.take());
        std::mem::forget(waiting);
        Some(Boarded {
            flights: self,
            ticket,
            guard: Some(guard),
            duplicate,
        })
    }

    /// Drops the ticket's flight once nobody holds or waits for it. Every reference is
    /// taken under the map's lock, so a count of one (the map's own) is final.
    fn leave(&self, ticket: TicketId) {
        let mut map = self.map();
        if map
            .get(&ticket)
            .is_some_and(|flight| Arc::strong_count(flight) == 1)
        {
            map.remove(&ticket);
        }
    }

    /// How many tickets have a flight now (for tests).
    pub fn len(&self) -> usize {
        self.map().len()
    }

    /// Whether no ticket has a flight.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn duplicates_board_one_after_another_and_leave_nothing_behind() {
        let flights = Flights::default();
        let ticket = TicketId::random();
        let soon = || Instant::now() + Duration::from_millis(100);
        let first = flights.board(ticket, soon()).await.unwrap();
        assert!(!first.duplicate());
        // A duplicate waits for the first; past its deadline it gives up.
        assert!(flights.board(ticket, soon()).await.is_none());
        let (second, ()) = tokio::join!(
            flights.board(ticket, Instant::now() + Duration::from_secs(5)),
            async {
                tokio::time::sleep(Duration::from_millis(20)).await;
                drop(first);
            }
        );
        let second = second.unwrap();
        assert!(second.duplicate());
        // Another ticket is never held up.
        let other = flights.board(TicketId::random(), soon()).await.unwrap();
        assert!(!other.duplicate());
        drop((second, other));
        assert!(flights.is_empty());
        // A ticket whose flight landed lately is a duplicate's, though nobody holds it.
        assert!(flights.board(ticket, soon()).await.unwrap().duplicate());
        // A waiter dropped mid-wait leaves nothing behind either.
        let held = flights.board(ticket, soon()).await.unwrap();
        let abandoned = flights.board(ticket, Instant::now() + Duration::from_secs(5));
        assert!(
            tokio::time::timeout(Duration::from_millis(20), abandoned)
                .await
                .is_err()
        );
        drop(held);
        assert!(flights.is_empty());
    }
}
