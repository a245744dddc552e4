//! `ModelStreamInfer`: inference requests on one bidirectional stream,
//! answered in the order they came (tritonclient's `start_stream` and
//! `async_stream_infer`).
//!
//! A reader takes the stream's messages one after another: each is decoded
//! and prepared ([`ModelHandle::prepare`]: validated, and for a stateful
//! model queued for its sequence's turn) in message order, then runs on a
//! task of its own, so the stream's requests for different sequences (or a
//! stateless model) batch together while one sequence's requests run in
//! order. Answers go back in message order. At most [`STREAM_IN_FLIGHT`]
//! requests of one stream are in the server at once; the reader waits
//! (and the client's sends with it) beyond that. A request that fails is
//! answered with `error_message`; the stream goes on.
//!
//! A request holds its slot and bytes (its message's, then its answer's
//! too) until its answer is handed over to be sent, not only until it is
//! computed: a client that does not read its answers holds the budget it
//! takes. A stream lives as long as its client: no body timeout applies to
//! it (a quiet instrument's stream waits for its next tick), and HTTP/2
//! keep-alive pings find a peer that is gone.
//!
//! [`ModelHandle::prepare`]: tickserve_runtime::ModelHandle::prepare

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_stream::Stream;
use tonic::{Request, Response, Status, Streaming};

use super::{convert, optional, pb};
use tickserve_core::sequence::KeyId;

use crate::transport::trace;
use tickserve_edge::BodyBytes;
use tickserve_edge::observe::Protocol;
use tickserve_edge::{Call, Edge, RequestBytes, Unsent};

/// Requests of one stream in the server at once.
pub const STREAM_IN_FLIGHT: usize = 256;

/// The answers of a stream, in order.
pub type AnswerStream =
    Pin<Box<dyn Stream<Item = Result<pb::ModelStreamInferResponse, Status>> + Send>>;

/// One request's answer, and what it holds until the answer is sent.
type Answered = (pb::ModelStreamInferResponse, Option<Unsent>);

/// Serves one `ModelStreamInfer` call.
pub fn serve(
    edge: Arc<Edge>,
    request: Request<Streaming<pb::ModelInferRequest>>,
) -> Response<AnswerStream> {
    let body = request.extensions().get::<Arc<BodyBytes>>().cloned();
    let key = request.extensions().get::<KeyId>().copied();
    let traceparent = trace::grpc(request.metadata());
    let mut incoming = request.into_inner();
    let (order, answers) = mpsc::channel::<JoinHandle<Answered>>(STREAM_IN_FLIGHT);
    tokio::spawn(async move {
        // A broken stream (or the client's half-close) ends the reader; what
        // it started is still answered while the client listens.
        while let Ok(Some(message)) = incoming.message().await {
            // The bytes that came for this message, now the message's.
            let bytes = match &body {
                Some(body) => RequestBytes::Held(body.take()),
                None => RequestBytes::Count(prost::Message::encoded_len(&message)),
            };
            let task = start(&edge, message, bytes, key, traceparent.clone()).await;
            if order.send(task).await.is_err() {
                break; // the client stopped listening
            }
        }
    });
    Response::new(Box::pin(Answers {
        tasks: answers,
        current: None,
        handed_over: None,
    }))
}

/// The stream's answers in message order; each answer's slot and bytes are
/// let go when the next is asked for (the one before has been taken to be
/// sent).
struct Answers {
    tasks: mpsc::Receiver<JoinHandle<Answered>>,
    current: Option<JoinHandle<Answered>>,
    handed_over: Option<Unsent>,
}

impl Stream for Answers {
    type Item = Result<pb::ModelStreamInferResponse, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.handed_over = None;
        loop {
            if let Some(task) = self.current.as_mut() {
                let done = match Pin::new(task).poll(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(done) => done,
                };
                self.current = None;
                let (answer, unsent) =
                    done.unwrap_or_else(|e| (failed(format!("internal error: {e}")), None));
                self.handed_over = unsent;
                return Poll::Ready(Some(Ok(answer)));
            }
            match self.tasks.poll_recv(cx) {
                Poll::Ready(Some(task)) => self.current = Some(task),
                Poll::Ready(None) => return Poll::Ready(None),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

fn failed(message: String) -> pb::ModelStreamInferResponse {
    pb::ModelStreamInferResponse {
        error_message: message,
        infer_response: None,
    }
}

/// Admits `message` here (in stream order: a sequence's requests take
/// their turns in the order they came), and runs it on a task of its own.
/// The message's bytes and slot are held until its answer is sent.
#[allow(clippy::disallowed_methods)] // request latency is the machine's time
async fn start(
    edge: &Arc<Edge>,
    mut message: pb::ModelInferRequest,
    bytes: RequestBytes,
    key: Option<KeyId>,
    traceparent: Option<String>,
) -> JoinHandle<Answered> {
    let started = Instant::now();
    let model = std::mem::take(&mut message.model_name);
    let version = std::mem::take(&mut message.model_version);
    let call = Call {
        protocol: Protocol::GrpcStream,
        model: &model,
        version: optional(&version),
        bytes,
        timeout: Ok(None),
        started,
        key,
        traceparent,
        // A stream is routed once, when it opens: its messages name their
        // sequences in their parameters.
        sequence_key: Ok(None),
        round: None,
    };
    let admitted = edge.admit_request(call, convert::Message(message)).await;
    tokio::spawn(async move {
        match admitted {
            Ok(admitted) => {
                let (result, mut unsent) = admitted.run_unsent().await;
                let answer = match result {
                    Ok(answer) => pb::ModelStreamInferResponse {
                        error_message: String::new(),
                        infer_response: Some(convert::encode(answer.response, answer.encoding)),
                    },
                    Err(e) => failed(e.client_message()),
                };
                unsent.hold_answer(prost::Message::encoded_len(&answer));
                (answer, Some(unsent))
            }
            Err(e) => (failed(e.client_message()), None),
        }
    })
}
