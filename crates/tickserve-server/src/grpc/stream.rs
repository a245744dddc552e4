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

use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};

use super::{convert, optional, pb};
use crate::edge::{Call, Edge};
use crate::observe::Protocol;

/// Requests of one stream in the server at once.
pub const STREAM_IN_FLIGHT: usize = 256;

/// The answers of a stream, in order.
pub type AnswerStream =
    Pin<Box<dyn Stream<Item = Result<pb::ModelStreamInferResponse, Status>> + Send>>;

/// Serves one `ModelStreamInfer` call.
pub fn serve(
    edge: Arc<Edge>,
    request: Request<Streaming<pb::ModelInferRequest>>,
) -> Response<AnswerStream> {
    let mut incoming = request.into_inner();
    let (order, answers) =
        mpsc::channel::<JoinHandle<pb::ModelStreamInferResponse>>(STREAM_IN_FLIGHT);
    tokio::spawn(async move {
        // A broken stream (or the client's half-close) ends the reader; what
        // it started is still answered while the client listens.
        while let Ok(Some(message)) = incoming.message().await {
            let task = start(&edge, message).await;
            if order.send(task).await.is_err() {
                break; // the client stopped listening
            }
        }
    });
    let answers = ReceiverStream::new(answers).then(|task| async move {
        Ok(task
            .await
            .unwrap_or_else(|e| failed(format!("internal error: {e}"))))
    });
    Response::new(Box::pin(answers))
}

fn failed(message: String) -> pb::ModelStreamInferResponse {
    pb::ModelStreamInferResponse {
        error_message: message,
        infer_response: None,
    }
}

/// Admits `message` here (in stream order: a sequence's requests take
/// their turns in the order they came), and runs it on a task of its own.
/// The message's bytes and slot are held until it is answered.
async fn start(
    edge: &Arc<Edge>,
    mut message: pb::ModelInferRequest,
) -> JoinHandle<pb::ModelStreamInferResponse> {
    let started = Instant::now();
    let bytes = prost::Message::encoded_len(&message);
    let model = std::mem::take(&mut message.model_name);
    let version = std::mem::take(&mut message.model_version);
    let call = Call {
        protocol: Protocol::GrpcStream,
        model: &model,
        version: optional(&version),
        bytes,
        timeout: Ok(None),
        started,
    };
    let admitted = edge.admit_request(call, convert::Message(message)).await;
    tokio::spawn(async move {
        match admitted {
            Ok(admitted) => match admitted.run().await {
                Ok(answer) => pb::ModelStreamInferResponse {
                    error_message: String::new(),
                    infer_response: Some(convert::encode(answer.response, answer.encoding)),
                },
                Err(e) => failed(e.client_message()),
            },
            Err(e) => failed(e.client_message()),
        }
    })
}
