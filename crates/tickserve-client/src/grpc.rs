//! The same API over gRPC (the v2 inference protocol), for a client on
//! another host: async [`GrpcClient`] and [`BlockingGrpcClient`].

use crate::{ClientError, DataType, ParamValue, Parameter, Tensor};

use tickserve_proto::inference as pb;

use pb::grpc_inference_service_client::GrpcInferenceServiceClient;

/// An async gRPC client; cheap to clone (one HTTP/2 connection).
#[derive(Clone)]
pub struct GrpcClient {
    inner: GrpcInferenceServiceClient<tonic::transport::Channel>,
}

impl GrpcClient {
    /// Connects to `address` (`http://127.0.0.1:8001`).
    pub async fn connect(address: &str) -> Result<GrpcClient, ClientError> {
        let inner = GrpcInferenceServiceClient::connect(address.to_string())
            .await
            .map_err(|e| ClientError::Disconnected(format!("{address}: {e}")))?;
        Ok(GrpcClient {
            inner: inner.max_decoding_message_size(usize::MAX),
        })
    }

    /// Runs `model` (its default version) on `inputs`; returns its outputs.
    pub async fn infer(&self, model: &str, inputs: &[Tensor]) -> Result<Vec<Tensor>, ClientError> {
        self.infer_with(model, inputs, &[]).await
    }

    /// [`GrpcClient::infer`] with request parameters (`priority`,
    /// `sequence_id`, `sequence_start`, ...; docs/protocol.md).
    pub async fn infer_with(
        &self,
        model: &str,
        inputs: &[Tensor],
        parameters: &[Parameter<'_>],
    ) -> Result<Vec<Tensor>, ClientError> {
        let request = pb::ModelInferRequest {
            parameters: parameters
                .iter()
                .map(|p| (p.name.to_string(), parameter(p.value)))
                .collect(),
            model_name: model.to_string(),
            inputs: inputs
                .iter()
                .map(|t| pb::model_infer_request::InferInputTensor {
                    name: t.name.clone(),
                    datatype: t.datatype.as_str().to_string(),
                    shape: t.shape.clone(),
                    ..Default::default()
                })
                .collect(),
            raw_input_contents: inputs.iter().map(|t| t.data.clone().into()).collect(),
            ..Default::default()
        };
        let response = self
            .inner
            .clone()
            .model_infer(request)
            .await
            .map_err(|status| ClientError::Server {
                code: code_name(status.code()).to_string(),
                message: status.message().to_string(),
            })?
            .into_inner();
        response
            .outputs
            .iter()
            .zip(response.raw_output_contents)
            .map(|(o, data)| {
                let datatype = DataType::parse(&o.datatype)
                    .ok_or_else(|| ClientError::Transport(format!("datatype {}", o.datatype)))?;
                Ok(Tensor {
                    name: o.name.clone(),
                    datatype,
                    shape: o.shape.clone(),
                    data: data.to_vec(),
                })
            })
            .collect()
    }
}

/// A parameter's value as the protocol carries it.
fn parameter(value: ParamValue<'_>) -> pb::InferParameter {
    use pb::infer_parameter::ParameterChoice;
    let choice = match value {
        ParamValue::Bool(b) => ParameterChoice::BoolParam(b),
        ParamValue::Int(i) => ParameterChoice::Int64Param(i),
        ParamValue::Uint(u) => ParameterChoice::Uint64Param(u),
        ParamValue::Double(d) => ParameterChoice::DoubleParam(d),
        ParamValue::Str(s) => ParameterChoice::StringParam(s.to_string()),
    };
    pb::InferParameter {
        parameter_choice: Some(choice),
    }
}

/// The gRPC code's name as the protocol spells it.
fn code_name(code: tonic::Code) -> &'static str {
    match code {
        tonic::Code::InvalidArgument => "INVALID_ARGUMENT",
        tonic::Code::NotFound => "NOT_FOUND",
        tonic::Code::Unavailable => "UNAVAILABLE",
        tonic::Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        tonic::Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        tonic::Code::Internal => "INTERNAL",
        tonic::Code::FailedPrecondition => "FAILED_PRECONDITION",
        tonic::Code::OutOfRange => "OUT_OF_RANGE",
        tonic::Code::PermissionDenied => "PERMISSION_DENIED",
        tonic::Code::Unauthenticated => "UNAUTHENTICATED",
        _ => "UNKNOWN",
    }
}

/// A blocking gRPC client: a [`GrpcClient`] on a runtime of its own.
pub struct BlockingGrpcClient {
    runtime: tokio::runtime::Runtime,
    client: GrpcClient,
}

impl BlockingGrpcClient {
    /// Connects to `address` (`http://127.0.0.1:8001`).
    pub fn connect(address: &str) -> Result<BlockingGrpcClient, ClientError> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| ClientError::Transport(format!("cannot start a runtime: {e}")))?;
        let client = runtime.block_on(GrpcClient::connect(address))?;
        Ok(BlockingGrpcClient { runtime, client })
    }

    /// Runs `model` on `inputs`; returns its outputs.
    pub fn infer(&self, model: &str, inputs: &[Tensor]) -> Result<Vec<Tensor>, ClientError> {
        self.runtime.block_on(self.client.infer(model, inputs))
    }

    /// [`BlockingGrpcClient::infer`] with request parameters.
    pub fn infer_with(
        &self,
        model: &str,
        inputs: &[Tensor],
        parameters: &[Parameter<'_>],
    ) -> Result<Vec<Tensor>, ClientError> {
        self.runtime
            .block_on(self.client.infer_with(model, inputs, parameters))
    }
}
