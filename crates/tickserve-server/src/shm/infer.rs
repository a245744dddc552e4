//! An inference through the edge: polled once on the front-end thread,
//! kept with its round while the round gathers, finished on the async
//! runtime when it must wait.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use tickserve_core::{Error, InferResponse};
use tickserve_edge::observe::Protocol;
use tickserve_edge::{Call, RequestBytes};
use tickserve_runtime::gather::Round;

use super::answer::respond;
use super::inputs::Inputs;
use super::{ActiveRequest, Context_};

/// A request of a gathering round whose answer was not ready when it was
/// first polled.
pub(super) struct Unfinished {
    active: ActiveRequest,
    request_id: u64,
    work: Work,
}

/// An inference through the edge, polled here first.
type Work = Pin<Box<dyn Future<Output = Result<InferResponse, Error>> + Send>>;

/// Runs what the round's requests parked (each model's rows together, on
/// this thread), then answers each request whose answer is now ready, in
/// the round's order; the rest finish on the async runtime.
pub(super) fn finish_round(context: &Context_, round: &Round, unfinished: &mut Vec<Unfinished>) {
    round.run();
    let limit = context.max_answer_bytes;
    let mut poll_context = Context::from_waker(Waker::noop());
    for Unfinished {
        active,
        request_id,
        mut work,
    } in unfinished.drain(..)
    {
        match work.as_mut().poll(&mut poll_context) {
            Poll::Ready(result) => respond(active, request_id, result, limit),
            Poll::Pending => finish_later(context, active, request_id, work),
        }
    }
}

/// Answers `work` once the async runtime has finished it.
fn finish_later(context: &Context_, active: ActiveRequest, request_id: u64, work: Work) {
    let limit = context.max_answer_bytes;
    context.runtime.spawn(async move {
        let result = work.await;
        respond(active, request_id, result, limit);
    });
}

/// Runs an inference through the edge: polled once here, finished on the
/// async runtime if it must wait (kept in `round` when gathering).
pub(super) fn infer(
    context: &Context_,
    active: ActiveRequest,
    request: Infer,
    round: Option<(&Round, &mut Vec<Unfinished>)>,
) {
    let edge = Arc::clone(&context.edge);
    let gather_in = round.as_ref().map(|(round, _)| Round::clone(round));
    let Infer {
        request_id,
        name,
        version,
        timeout_us,
        inputs,
        size,
        started,
    } = request;
    let work = async move {
        let call = Call {
            protocol: Protocol::Shm,
            model: &name,
            version: (!version.is_empty()).then_some(version.as_str()),
            bytes: RequestBytes::Count(size),
            // Shared memory carries no keys (docs/security.md): any process
            // of this host that can open the service may call it.
            key: None,
            traceparent: None,
            timeout: Ok((timeout_us > 0).then(|| Duration::from_micros(u64::from(timeout_us)))),
            started,
            // One host, no balancer: the parameter block names the sequence.
            sequence_key: Ok(None),
            round: gather_in,
        };
        edge.infer(call, inputs).await.map(|answer| answer.response)
    };
    let mut work: Work = Box::pin(work);
    let mut poll_context = Context::from_waker(Waker::noop());
    match work.as_mut().poll(&mut poll_context) {
        Poll::Ready(result) => respond(active, request_id, result, context.max_answer_bytes),
        Poll::Pending => match round {
            Some((_, unfinished)) => unfinished.push(Unfinished {
                active,
                request_id,
                work,
            }),
            None => finish_later(context, active, request_id, work),
        },
    }
}

/// An inference request off the wire, its inputs copied.
pub(super) struct Infer {
    pub(super) request_id: u64,
    pub(super) name: String,
    pub(super) version: String,
    pub(super) timeout_us: u32,
    pub(super) inputs: Inputs,
    /// The request's bytes, held in `server.max_inflight_bytes`.
    pub(super) size: usize,
    pub(super) started: Instant,
}
