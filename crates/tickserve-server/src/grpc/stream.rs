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

use tickserve_core::{Error, InferResponse};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};

use super::{convert, optional, pb};
use crate::Shared;
use crate::observe::{self, Protocol};

/// Requests of one stream in the server at once.
pub const STREAM_IN_FLIGHT: usize = 256;

/// The answers of a stream, in order.
pub type AnswerStream =
    Pin<Box<dyn Stream<Item = Result<pb::ModelStreamInferResponse, Status>> + Send>>;

/// Serves one `ModelStreamInfer` call.
pub fn serve(
    shared: Arc<Shared>,
    request: Request<Streaming<pb::ModelInferRequest>>,
) -> Response<AnswerStream> {
    let mut incoming = request.into_inner();
    let (order, answers) =
        mpsc::channel::<JoinHandle<pb::ModelStreamInferResponse>>(STREAM_IN_FLIGHT);
    tokio::spawn(async move {
        // A broken stream (or the client's half-close) ends the reader; what
        // it started is still answered while the client listens.
        while let Ok(Some(message)) = incoming.message().await {
            let task = start(&shared, message);
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

/// Decodes and prepares `message` here (in stream order), and runs it on a
/// task of its own.
fn start(
    shared: &Arc<Shared>,
    message: pb::ModelInferRequest,
) -> JoinHandle<pb::ModelStreamInferResponse> {
    let started = Instant::now();
    let runtime = &shared.runtime;
    let handle = runtime.model(&message.model_name, optional(&message.model_version));
    let label = match &handle {
        Ok(h) => h.name.clone(),
        Err(_) => runtime.model_label(&message.model_name),
    };
    let prepared = (|| {
        if !shared.ready() {
            return Err(Error::ShuttingDown);
        }
        // The message's bytes count in the server-wide budget until it is answered.
        let bytes = shared.admit_bytes_owned(prost::Message::encoded_len(&message))?;
        let handle = handle?;
        let (request, raw) = convert::decode(message, None, &handle.signature)?;
        let prepared = handle.prepare(request)?;
        Ok((handle, prepared, raw, bytes))
    })();
    let shared = Arc::clone(shared);
    tokio::spawn(async move {
        let result: Result<(InferResponse, bool), Error> = async {
            let (handle, prepared, raw, _bytes) = prepared?;
            let _slot = shared.admit()?;
            Ok((handle.run(prepared).await?, raw))
        }
        .await;
        observe::record_request(Protocol::GrpcStream, &label, started, &result);
        match result {
            Ok((response, raw)) => pb::ModelStreamInferResponse {
                error_message: String::new(),
                infer_response: Some(convert::encode(response, raw)),
            },
            Err(e) => failed(e.to_string()),
        }
    })
}
