//! TF Serving's gRPC API on the gRPC port: `PredictionService` (Predict,
//! GetModelMetadata) and `ModelService` (GetModelStatus), with messages
//! generated from `proto/tensorflow*` (wire-compatible with TF Serving's).

use std::sync::Arc;

use prost::Message;
use tickserve_core::{Error, Signature, TensorSpec};
use tickserve_runtime::ModelHandle;
use tonic::{Request, Response, Status};

use super::tensor;
use super::{PREDICT_METHOD, SIGNATURE_NAME, alias, check_signature, output, tf_dtype};
use crate::transport::entrance::Entrance;
use crate::transport::status::grpc as status;
use tickserve_edge::observe::Protocol;
use tickserve_edge::params::Parameters;
use tickserve_edge::{Decoded, Edge, Payload};

use tickserve_proto::tensorflow as pb;

use pb::serving::model_service_server::{ModelService, ModelServiceServer};
use pb::serving::prediction_service_server::{PredictionService, PredictionServiceServer};
use pb::serving::{
    GetModelMetadataRequest, GetModelMetadataResponse, GetModelStatusRequest,
    GetModelStatusResponse, ModelSpec, ModelVersionStatus, PredictRequest, PredictResponse,
    SignatureDefMap, StatusProto, model_spec::VersionChoice,
};

/// The `type_url` of the `signature_def` metadata field's `Any`.
const SIGNATURE_DEF_MAP_TYPE: &str = "type.googleapis.com/tensorflow.serving.SignatureDefMap";

/// TF Serving's two services over the edge.
#[derive(Clone)]
pub struct TfServing {
    edge: Arc<Edge>,
}

impl TfServing {
    /// The services over `edge`, each limited to `limit` bytes per message.
    pub fn services(
        edge: Arc<Edge>,
        limit: usize,
    ) -> (
        PredictionServiceServer<TfServing>,
        ModelServiceServer<TfServing>,
    ) {
        let service = TfServing { edge };
        (
            PredictionServiceServer::new(service.clone())
                .max_decoding_message_size(limit)
                .max_encoding_message_size(usize::MAX),
            ModelServiceServer::new(service)
                .max_decoding_message_size(limit)
                .max_encoding_message_size(usize::MAX),
        )
    }

    /// The model version a `ModelSpec` names.
    fn model(&self, spec: Option<&ModelSpec>) -> Result<Arc<ModelHandle>, Error> {
        let (name, version) = spec_target(spec)?;
        self.edge.runtime.model(&name, version.as_deref())
    }
}

/// The model name and version (a number, or a label) a `ModelSpec` asks
/// for; a missing spec or name or another signature are request errors.
fn spec_target(spec: Option<&ModelSpec>) -> Result<(String, Option<String>), Error> {
    let Some(spec) = spec.filter(|s| !s.name.is_empty()) else {
        return Err(Error::request(
            "_tfserving",
            "the request has no model_spec with a model name",
        ));
    };
    check_signature(&spec.name, &spec.signature_name)?;
    let version = match &spec.version_choice {
        None => None,
        Some(VersionChoice::Version(v)) => {
            if *v < 0 {
                return Err(Error::request(
                    &spec.name,
                    format!("model_spec.version {v} is negative"),
                ));
            }
            Some(v.to_string())
        }
        Some(VersionChoice::VersionLabel(label)) => Some(label.clone()),
    };
    Ok((spec.name.clone(), version))
}

/// The `ModelSpec` of an answer from `handle`.
fn answer_spec(handle: &ModelHandle) -> ModelSpec {
    ModelSpec {
        name: handle.name.clone(),
        version_choice: handle
            .version
            .parse::<i64>()
            .ok()
            .map(VersionChoice::Version),
        signature_name: SIGNATURE_NAME.to_string(),
    }
}

/// A `PredictRequest` as tonic decoded it, for the edge to convert for its
/// model; tensors hold at most `max_bytes`.
struct Predict {
    request: PredictRequest,
    max_bytes: usize,
}

impl Payload for Predict {
    type Encoding = ();

    fn decode_bytes(&self) -> usize {
        0
    }

    fn expansion(&self, handle: &ModelHandle) -> Result<usize, Error> {
        let model = handle.name.as_str();
        let limits = &handle.settings.limits;
        let mut total = 0usize;
        for (name, tensor) in &self.request.inputs {
            let spec = super::input(model, &handle.signature, name)?;
            let bytes = tensor::expansion(model, spec, tensor, limits, self.max_bytes)?;
            total = total.saturating_add(bytes);
        }
        Ok(total)
    }

    fn decode(self, handle: &ModelHandle) -> Result<Decoded<()>, Error> {
        predict_request(handle, self.request, self.max_bytes)
    }
}

/// Converts a `PredictRequest` for `handle` into the edge's request. TF
/// Serving's API has no request parameters: a request gets the model's
/// defaults (docs/tfserving.md).
fn predict_request(
    handle: &ModelHandle,
    request: PredictRequest,
    max_bytes: usize,
) -> Result<Decoded<()>, Error> {
    let model = handle.name.as_str();
    let signature: &Signature = &handle.signature;
    let mut inputs = Vec::with_capacity(request.inputs.len());
    for (name, tensor_proto) in request.inputs {
        let spec = super::input(model, signature, &name)?;
        if inputs
            .iter()
            .any(|t: &tickserve_core::InputTensor| t.name == spec.name)
        {
            return Err(Error::request(
                model,
                format!(
                    "inputs name '{}' twice (as '{name}' and as its alias)",
                    spec.name
                ),
            ));
        }
        inputs.push(tensor::decode(model, spec, tensor_proto, max_bytes)?);
    }
    let outputs = if request.output_filter.is_empty() {
        None
    } else {
        let mut names: Vec<String> = Vec::with_capacity(request.output_filter.len());
        for name in &request.output_filter {
            let onnx = output(model, signature, name)?;
            if names.contains(&onnx) {
                return Err(Error::request(
                    model,
                    format!("output_filter names '{name}' twice"),
                ));
            }
            names.push(onnx);
        }
        Some(names)
    };
    Ok(Decoded {
        id: String::new(),
        inputs,
        outputs,
        parameters: Parameters::default(),
        encoding: (),
    })
}

/// A tensor's `TensorInfo`: its ONNX name, dtype and shape (batch -1).
fn tensor_info(spec: &TensorSpec) -> pb::TensorInfo {
    pb::TensorInfo {
        encoding: Some(pb::tensor_info::Encoding::Name(spec.name.clone())),
        dtype: tf_dtype(spec.datatype),
        tensor_shape: Some(tensor::shape(&spec.protocol_shape())),
    }
}

/// The model's one signature, `serving_default`.
pub fn signature_def(signature: &Signature) -> pb::SignatureDef {
    let map = |specs: &[TensorSpec]| {
        specs
            .iter()
            .map(|t| (alias(&t.name).to_string(), tensor_info(t)))
            .collect()
    };
    pb::SignatureDef {
        inputs: map(&signature.inputs),
        outputs: map(&signature.outputs),
        method_name: PREDICT_METHOD.to_string(),
        defaults: Default::default(),
    }
}

#[tonic::async_trait]
impl PredictionService for TfServing {
    async fn predict(
        &self,
        request: Request<PredictRequest>,
    ) -> Result<Response<PredictResponse>, Status> {
        let entrance = Entrance::grpc(&request);
        let started = entrance.started();
        let request = request.into_inner();
        let (model, version) = match spec_target(request.model_spec.as_ref()) {
            Ok(target) => target,
            Err(e) => {
                let name = request.model_spec.as_ref().map_or("", |s| s.name.as_str());
                let e = self.edge.refuse(Protocol::TfServingGrpc, name, started, e);
                return Err(status(&e));
            }
        };
        let call = entrance.call(Protocol::TfServingGrpc, &model, version.as_deref(), || {
            request.encoded_len()
        });
        let payload = Predict {
            request,
            max_bytes: self.edge.max_request_bytes,
        };
        let answer = self
            .edge
            .infer(call, payload)
            .await
            .map_err(|e| status(&e))?;
        Ok(Response::new(PredictResponse {
            model_spec: Some(answer_spec(&answer.handle)),
            outputs: answer
                .response
                .outputs
                .iter()
                .map(|o| (alias(&o.name).to_string(), tensor::encode(o)))
                .collect(),
        }))
    }

    async fn get_model_metadata(
        &self,
        request: Request<GetModelMetadataRequest>,
    ) -> Result<Response<GetModelMetadataResponse>, Status> {
        let request = request.into_inner();
        let handle = self
            .model(request.model_spec.as_ref())
            .map_err(|e| status(&e))?;
        if request.metadata_field.is_empty() {
            return Err(status(&Error::request(
                &handle.name,
                "GetModelMetadataRequest must name at least one metadata_field (\"signature_def\")",
            )));
        }
        if let Some(other) = request
            .metadata_field
            .iter()
            .find(|f| *f != "signature_def")
        {
            return Err(status(&Error::request(
                &handle.name,
                format!("metadata field \"{other}\" is not supported; \"signature_def\" is"),
            )));
        }
        let map = SignatureDefMap {
            signature_def: [(SIGNATURE_NAME.to_string(), signature_def(&handle.signature))]
                .into_iter()
                .collect(),
        };
        let any = prost_types::Any {
            type_url: SIGNATURE_DEF_MAP_TYPE.to_string(),
            value: map.encode_to_vec(),
        };
        Ok(Response::new(GetModelMetadataResponse {
            model_spec: Some(answer_spec(&handle)),
            metadata: [("signature_def".to_string(), any)].into_iter().collect(),
        }))
    }
}

#[tonic::async_trait]
impl ModelService for TfServing {
    async fn get_model_status(
        &self,
        request: Request<GetModelStatusRequest>,
    ) -> Result<Response<GetModelStatusResponse>, Status> {
        let request = request.into_inner();
        let (name, version) = spec_target(request.model_spec.as_ref()).map_err(|e| status(&e))?;
        let statuses = super::version_statuses(&self.edge.runtime, &name, version.as_deref())
            .map_err(|e| status(&e))?
            .into_iter()
            .map(|s| ModelVersionStatus {
                version: i64::try_from(s.version).unwrap_or(i64::MAX),
                state: s.state as i32,
                status: Some(StatusProto {
                    error_code: s.code as i32,
                    error_message: s.message,
                }),
            })
            .collect();
        Ok(Response::new(GetModelStatusResponse {
            model_version_status: statuses,
        }))
    }
}
