//! Fair turns between shared-memory clients.
//!
//! iceoryx2's `Server::receive` gives the first waiting request in its order
//! of client connections. A front-end thread that takes one request, answers
//! it and asks again therefore serves the first-connected clients over and
//! over while they keep sending, and a later-connected client waits until
//! they pause: on 16 cores, 64 instances of the 2 × 128 LSTM tick over one
//! front-end thread saw a p99.9 of 109 ms and one tick of 930 ms, while the
//! server's own time per request stayed under 0.5 ms for every request.
//!
//! A front-end thread's round takes every request waiting now, then answers
//! them in that order; its next round starts when this one is answered. A
//! request waits behind at most the round it joins, whatever its client's
//! place in the connection order. Each thread keeps its own round: one
//! round shared by the threads (under a lock) served 64 instances 25-30 %
//! slower with four threads on the same machine (`bench/results`, the
//! shared-memory rounds run).

use std::collections::VecDeque;

/// The requests of the current round, not yet given out.
#[derive(Debug)]
pub(super) struct Rounds<R> {
    round: VecDeque<R>,
    /// The most requests one round takes (every client's every request in
    /// flight: more cannot be waiting).
    limit: usize,
}

impl<R> Rounds<R> {
    /// Rounds of at most `limit` requests.
    pub(super) fn new(limit: usize) -> Rounds<R> {
        Rounds {
            round: VecDeque::with_capacity(limit),
            limit,
        }
    }

    /// The next request: the current round's next, else the first of a new
    /// round of what `receive` gives until it gives nothing. An error from
    /// `receive` ends the round taken so far (the next round asks again), or
    /// is returned when it comes first.
    pub(super) fn next<E>(
        &mut self,
        mut receive: impl FnMut() -> Result<Option<R>, E>,
    ) -> Result<Option<R>, E> {
        if self.round.is_empty() {
            while self.round.len() < self.limit {
                match receive() {
                    Ok(Some(request)) => self.round.push_back(request),
                    Ok(None) => break,
                    Err(e) if self.round.is_empty() => return Err(e),
                    Err(_) => break,
                }
            }
        }
        Ok(self.round.pop_front())
    }

    /// The requests of the current round not yet given out.
    pub(super) fn left(&self) -> usize {
        self.round.len()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use iceoryx2::prelude::*;

    use super::*;

    type Service = ipc_threadsafe::Service;

    type Client = iceoryx2::port::client::Client<Service, [u8], (), [u8], ()>;
    type Pending = iceoryx2::pending_response::PendingResponse<Service, [u8], (), [u8], ()>;

    /// Sends `byte` from `client`; its pending answer is kept in `pending`
    /// (the test reads the server side only).
    fn send(client: &Client, byte: u8, pending: &mut Vec<Pending>) {
        let mut request = client.loan_slice(1).unwrap();
        request.payload_mut()[0] = byte;
        pending.push(request.send().unwrap());
    }

    #[test]
    fn a_later_connected_client_is_answered_before_an_earlier_ones_next_request() {
        let node = NodeBuilder::new().create::<Service>().unwrap();
        let name = format!("tickserve-rounds-test-{}", std::process::id());
        let service = node
            .service_builder(&name.as_str().try_into().unwrap())
            .request_response::<[u8], [u8]>()
            .max_active_requests_per_client(4)
            .create()
            .unwrap();
        let server = service.server_builder().create().unwrap();
        let (a, b) = (
            service.client_builder().create().unwrap(),
            service.client_builder().create().unwrap(),
        );
        let mut pending = Vec::new();
        send(&a, 1, &mut pending);
        send(&b, 2, &mut pending);
        let mut rounds = Rounds::new(64);
        let mut answered = Vec::new();
        let mut take = |rounds: &mut Rounds<_>| {
            let active = rounds.next(|| server.receive()).unwrap().unwrap();
            answered.push(active.payload()[0]);
        };
        take(&mut rounds);
        // `a` was answered and sends again at once, before `b` is answered;
        // iceoryx2 alone would give `a`'s new request first (it is the
        // first connection).
        send(&a, 3, &mut pending);
        take(&mut rounds);
        take(&mut rounds);
        assert_eq!(answered, [1, 2, 3]);
        assert!(rounds.next(|| server.receive()).unwrap().is_none());
    }

    #[test]
    fn an_error_ends_the_round_and_comes_out_when_it_comes_first() {
        let mut rounds = Rounds::new(8);
        let mut script = vec![Err("again"), Err("broken"), Ok(Some(2)), Ok(Some(1))];
        assert_eq!(rounds.next(|| script.pop().unwrap()), Ok(Some(1)));
        assert_eq!(rounds.next(|| script.pop().unwrap()), Ok(Some(2)));
        assert_eq!(rounds.next(|| script.pop().unwrap()), Err("again"));
        // A round never takes more than its limit.
        let mut rounds = Rounds::new(2);
        let mut n = 0;
        let mut endless = || {
            n += 1;
            Ok::<_, ()>(Some(n))
        };
        assert_eq!(rounds.next(&mut endless), Ok(Some(1)));
        assert_eq!(rounds.next(&mut endless), Ok(Some(2)));
        assert_eq!(rounds.next(&mut endless), Ok(Some(3)));
    }
}
