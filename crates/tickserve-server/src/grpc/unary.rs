//! The unary `ModelInfer` call. The gRPC port serves it from the message's
//! bytes ([`ModelInfer`]): a request of the common shape (raw tensor
//! contents, no typed contents) is read in place
//! ([`tickserve_proto::view`]), its names and shapes straight into the
//! core's request and its tensors as slices of the received frame; any other
//! message is decoded by prost behind the same limits walk as every other
//! gRPC message ([`bounded::decode_infer_request`]) and answered as the
//! generated service answers it ([`answer_message`]).

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use tickserve_core::request::MAX_ID_BYTES;
use tickserve_core::{DataType, Error, InputTensor};
use tickserve_proto::bounded;
use tickserve_proto::fast::view;
use tickserve_runtime::ModelHandle;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::{Request, Response, Status};

use super::fast::answer::UnaryAnswer;
use super::{convert, optional, pb};
use crate::transport::status::grpc as status;
use crate::transport::{entrance::Entrance, sequence_key};
use tickserve_edge::observe::Protocol;
use tickserve_edge::params::Parameters;
use tickserve_edge::{Decoded, Edge, MAX_TENSORS, Payload};

/// A boxed future, as tonic's generated services box theirs.
type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// The method's path, which the gRPC port routes to [`ModelInfer`].
pub const PATH: &str = "/inference.GRPCInferenceService/ModelInfer";

/// The unary `ModelInfer` method as a service of its own, over `edge`,
/// taking messages of at most `limit` bytes (as the generated service
/// does, with the same answer for a larger one).
#[derive(Clone)]
pub struct ModelInfer {
    edge: Arc<Edge>,
    limit: usize,
}

impl ModelInfer {
    /// The method over `edge`, taking messages of at most `limit` bytes.
    pub fn new(edge: Arc<Edge>, limit: usize) -> ModelInfer {
        ModelInfer { edge, limit }
    }
}

impl tower::Service<http::Request<axum::body::Body>> for ModelInfer {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<axum::body::Body>) -> Self::Future {
        let method = Method(Arc::clone(&self.edge));
        let limit = self.limit;
        Box::pin(async move {
            let mut grpc = tonic::server::Grpc::new(FrameCodec)
                .apply_max_message_size_config(Some(limit), Some(usize::MAX));
            Ok(grpc.unary(method, request).await)
        })
    }
}

/// The method's handler, over the edge.
struct Method(Arc<Edge>);

impl tonic::server::UnaryService<Bytes> for Method {
    type Response = UnaryAnswer;
    type Future = BoxFuture<Result<Response<UnaryAnswer>, Status>>;

    fn call(&mut self, request: Request<Bytes>) -> Self::Future {
        let edge = Arc::clone(&self.0);
        Box::pin(async move { answer_frame(&edge, request).await })
    }
}

/// The codec of [`ModelInfer`]: a request is its message's bytes, taken
/// from the frame without a copy; the answer is written from the core's
/// response ([`UnaryAnswer::encode`]).
struct FrameCodec;

impl Codec for FrameCodec {
    type Encode = UnaryAnswer;
    type Decode = Bytes;
    type Encoder = AnswerEncoder;
    type Decoder = FrameDecoder;

    fn encoder(&mut self) -> Self::Encoder {
        AnswerEncoder
    }

    fn decoder(&mut self) -> Self::Decoder {
        FrameDecoder
    }
}

/// A message as the bytes it came in.
struct FrameDecoder;

impl Decoder for FrameDecoder {
    type Item = Bytes;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}

/// An answer as its `ModelInferResponse` bytes.
struct AnswerEncoder;

impl Encoder for AnswerEncoder {
    type Item = UnaryAnswer;
    type Error = Status;

    fn encode(&mut self, answer: UnaryAnswer, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        answer.encode(dst);
        Ok(())
    }
}

/// What a unary call carries beside its message.
struct Unary {
    entrance: Entrance,
    /// The connection's first answer may teach the timing names.
    teach: bool,
}

impl Unary {
    fn of<T>(request: &Request<T>) -> Unary {
        let entrance = Entrance::grpc(request);
        Unary {
            teach: entrance.first_on_connection(),
            entrance,
        }
    }

    /// Answers the request for `model` at `version` that `payload` holds;
    /// `len` is its size where no listener counted it.
    async fn answer<P: Payload<Encoding = bool>>(
        self,
        edge: &Arc<Edge>,
        model: &str,
        version: &str,
        payload: P,
        len: impl FnOnce() -> usize,
    ) -> Result<Response<UnaryAnswer>, Status> {
        let call = self
            .entrance
            .call(Protocol::Grpc, model, optional(version), len);
        let answer = edge.infer(call, payload).await.map_err(|e| status(&e))?;
        let timing = answer.response.timing;
        let sequence = answer.sequence;
        let message = UnaryAnswer {
            response: answer.response,
            raw: answer.encoding,
        };
        // Room for tonic's content-type (and grpc-encoding) beside the two
        // timing headers: a map that grows rehashes (about 1.5k instructions).
        let mut headers = http::HeaderMap::with_capacity(4);
        if edge.timing_headers {
            crate::timing::add(&mut headers, &timing, self.teach);
        }
        if let Some(value) = sequence.and_then(|s| http::HeaderValue::from_str(&s).ok()) {
            headers.insert(sequence_key::NAME.clone(), value);
        }
        Ok(Response::from_parts(
            tonic::metadata::MetadataMap::from_headers(headers),
            message,
            tonic::Extensions::default(),
        ))
    }
}

/// Answers a call whose message tonic decoded (the generated service's
/// method, where it is served without [`ModelInfer`]).
pub async fn answer_message(
    edge: &Arc<Edge>,
    request: Request<pb::ModelInferRequest>,
) -> Result<Response<pb::ModelInferResponse>, Status> {
    let unary = Unary::of(&request);
    let message = request.into_inner();
    let len = prost::Message::encoded_len(&message);
    let answer = answer_decoded(unary, edge, message, len).await?;
    Ok(answer.map(UnaryAnswer::message))
}

/// Answers a call from its message's bytes: read in place where it has the
/// common shape, decoded by prost otherwise.
async fn answer_frame(
    edge: &Arc<Edge>,
    request: Request<Bytes>,
) -> Result<Response<UnaryAnswer>, Status> {
    let unary = Unary::of(&request);
    let frame = request.into_inner();
    let len = frame.len();
    if let Some(read) = view::infer_request(&frame, MAX_TENSORS) {
        let (model, version) = (read.model_name, read.model_version);
        if let Some(payload) = Read::of(read, &frame) {
            return unary.answer(edge, model, version, payload, || len).await;
        }
    }
    let message = bounded::decode_infer_request(frame)?;
    answer_decoded(unary, edge, message, len).await
}

/// Answers a call whose message prost decoded (`len` bytes on the wire).
async fn answer_decoded(
    unary: Unary,
    edge: &Arc<Edge>,
    mut message: pb::ModelInferRequest,
    len: usize,
) -> Result<Response<UnaryAnswer>, Status> {
    // The name and version go to the edge; the rest is decoded there.
    let model = std::mem::take(&mut message.model_name);
    let version = std::mem::take(&mut message.model_version);
    unary
        .answer(edge, &model, &version, convert::Message(message), || len)
        .await
}

/// A request read in place, in the core's terms but for its parameters
/// (read against the model the edge finds, as prost's path reads them).
struct Read {
    id: String,
    inputs: Vec<InputTensor>,
    outputs: Option<Vec<String>>,
    parameters: Vec<(String, pb::InferParameter)>,
}

impl Read {
    /// The request `view` of `frame`, where every input is raw, has a known
    /// datatype and the id is within its limit; `None` otherwise, for
    /// prost's path to answer (with its errors).
    fn of(view: view::InferRequestView<'_>, frame: &Bytes) -> Option<Read> {
        if view.inputs.is_empty()
            || view.raw_input_contents.len() != view.inputs.len()
            || view.id.len() > MAX_ID_BYTES
        {
            return None;
        }
        let mut inputs = Vec::with_capacity(view.inputs.len());
        for (input, range) in view.inputs.into_iter().zip(view.raw_input_contents) {
            inputs.push(InputTensor {
                name: input.name.to_owned(),
                datatype: DataType::parse(input.datatype)?,
                shape: input.shape,
                data: frame.slice(range),
            });
        }
        Some(Read {
            id: view.id.to_owned(),
            inputs,
            outputs: (!view.outputs.is_empty())
                .then(|| view.outputs.iter().map(|&name| name.to_owned()).collect()),
            parameters: view
                .parameters
                .into_iter()
                .map(|(key, value)| (key.to_owned(), value))
                .collect(),
        })
    }
}

impl Payload for Read {
    /// Raw inputs: the answer goes back as `raw_output_contents`.
    type Encoding = bool;

    fn decode_bytes(&self) -> usize {
        // Read already; the tensors are slices of the frame.
        0
    }

    fn decode(self, handle: &ModelHandle) -> Result<Decoded<bool>, Error> {
        let given = self.parameters.iter();
        let parameters = Parameters::read(
            &handle.name,
            given.map(|(name, value)| (name.as_str(), convert::param(value))),
        )?;
        Ok(Decoded {
            id: self.id,
            inputs: self.inputs,
            outputs: self.outputs,
            parameters,
            encoding: true,
        })
    }
}
