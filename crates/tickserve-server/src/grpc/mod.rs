//! The gRPC front end of the KServe v2 protocol:
//! `inference.GRPCInferenceService` (with Triton's ModelConfig and
//! ModelStatistics), and the sequence-state service ([`sequences`]). The
//! gRPC port ([`crate::ports::grpc`]) serves them beside TF Serving's.
//! Inference goes through the edge's pipeline; errors become statuses in
//! [`crate::transport::status`].

pub mod convert;
pub mod fast;
pub mod risk;
pub mod sequences;
pub mod stream;
pub mod unary;

use std::sync::Arc;

use tickserve_core::{Error, TensorSpec};
use tickserve_runtime::ModelHandle;
use tonic::{Request, Response, Status};

use crate::control;
use crate::identity::{EXTENSIONS, SERVER_NAME, SERVER_VERSION};
use crate::model_view::{
    DurationView, InstanceKind, ModelConfigView, SequenceBatchingView, StatisticsView,
};
use crate::transport::status::grpc as status;
use tickserve_edge::Edge;
use tickserve_edge::observe::Protocol;

use tickserve_proto::inference as pb;

use pb::grpc_inference_service_server::{GrpcInferenceService, GrpcInferenceServiceServer};
use pb::model_config::SchedulingChoice;

/// The v2 inference service, as the gRPC port mounts it.
pub type Server = GrpcInferenceServiceServer<InferenceService>;

/// The v2 inference service over `edge`, decoding messages of at most
/// `limit` bytes.
pub fn service(edge: Arc<Edge>, limit: usize) -> Server {
    GrpcInferenceServiceServer::new(InferenceService { edge })
        .max_decoding_message_size(limit)
        .max_encoding_message_size(usize::MAX)
}

/// The v2 inference service over the edge.
pub struct InferenceService {
    edge: Arc<Edge>,
}

fn optional(version: &str) -> Option<&str> {
    (!version.is_empty()).then_some(version)
}

impl InferenceService {
    fn model(&self, name: &str, version: &str) -> Result<Arc<ModelHandle>, Status> {
        self.edge
            .runtime
            .model(name, optional(version))
            .map_err(|e| status(&e))
    }
}

fn tensor_metadata(specs: &[TensorSpec]) -> Vec<pb::model_metadata_response::TensorMetadata> {
    specs
        .iter()
        .map(|t| pb::model_metadata_response::TensorMetadata {
            name: t.name.clone(),
            datatype: t.datatype.as_str().to_string(),
            shape: t.protocol_shape(),
        })
        .collect()
}

fn queue_policy(view: crate::model_view::QueuePolicyView) -> pb::ModelQueuePolicy {
    use pb::model_queue_policy::TimeoutAction;
    pb::ModelQueuePolicy {
        timeout_action: if view.timeout_action == "DELAY" {
            TimeoutAction::Delay
        } else {
            TimeoutAction::Reject
        } as i32,
        default_timeout_microseconds: view.default_timeout_microseconds,
        allow_timeout_override: view.allow_timeout_override,
        max_queue_size: u32::try_from(view.max_queue_size).unwrap_or(u32::MAX),
    }
}

fn config_type(datatype: tickserve_core::DataType) -> i32 {
    use pb::DataType as P;
    use tickserve_core::DataType as D;
    (match datatype {
        D::Bool => P::TypeBool,
        D::Uint8 => P::TypeUint8,
        D::Uint16 => P::TypeUint16,
        D::Uint32 => P::TypeUint32,
        D::Uint64 => P::TypeUint64,
        D::Int8 => P::TypeInt8,
        D::Int16 => P::TypeInt16,
        D::Int32 => P::TypeInt32,
        D::Int64 => P::TypeInt64,
        D::Fp32 => P::TypeFp32,
        D::Fp64 => P::TypeFp64,
    }) as i32
}

fn duration(d: DurationView) -> Option<pb::StatisticDuration> {
    Some(pb::StatisticDuration {
        count: d.count,
        ns: d.ns,
    })
}

/// The statistics view as the gRPC message.
fn model_statistics(handle: &ModelHandle) -> pb::ModelStatistics {
    let view = StatisticsView::of(handle);
    let i = view.inference_stats;
    pb::ModelStatistics {
        name: view.name,
        version: view.version,
        last_inference: view.last_inference,
        inference_count: view.inference_count,
        execution_count: view.execution_count,
        inference_stats: Some(pb::InferStatistics {
            success: duration(i.success),
            fail: duration(i.fail),
            queue: duration(i.queue),
            compute_input: duration(i.compute_input),
            compute_infer: duration(i.compute_infer),
            compute_output: duration(i.compute_output),
        }),
        batch_stats: view
            .batch_stats
            .into_iter()
            .map(|b| pb::InferBatchStatistics {
                batch_size: b.batch_size as u64,
                compute_input: None,
                compute_infer: duration(b.compute_infer),
                compute_output: None,
            })
            .collect(),
    }
}

/// The configuration view as the gRPC message.
fn sizes(sizes: &[usize]) -> Vec<i32> {
    sizes
        .iter()
        .map(|&s| i32::try_from(s).unwrap_or(i32::MAX))
        .collect()
}

/// Triton's `ModelSequenceBatching` from the view.
fn sequence_batching(view: SequenceBatchingView) -> pb::ModelSequenceBatching {
    use pb::model_sequence_batching as sb;
    let dims = |dims: &[usize]| dims.iter().map(|&d| d as i64).collect::<Vec<i64>>();
    pb::ModelSequenceBatching {
        max_sequence_idle_microseconds: view.max_sequence_idle_microseconds,
        control_input: Vec::new(),
        strategy_choice: Some(sb::StrategyChoice::Oldest(sb::StrategyOldest {
            max_candidate_sequences: i32::try_from(view.oldest.max_candidate_sequences)
                .unwrap_or(i32::MAX),
            preferred_batch_size: sizes(&view.oldest.preferred_batch_size),
            max_queue_delay_microseconds: view.oldest.max_queue_delay_microseconds,
        })),
        state: view
            .state
            .into_iter()
            .map(|s| sb::State {
                input_name: s.input_name,
                output_name: s.output_name,
                data_type: config_type(s.datatype),
                dims: dims(&s.dims),
                initial_state: s
                    .initial_state
                    .into_iter()
                    .map(|i| sb::InitialState {
                        data_type: config_type(s.datatype),
                        dims: dims(&i.dims),
                        name: i.name,
                        state_data: Some(match i.data_file {
                            Some(file) => sb::initial_state::StateData::DataFile(file),
                            None => sb::initial_state::StateData::ZeroData(true),
                        }),
                    })
                    .collect(),
            })
            .collect(),
    }
}

fn model_config(view: ModelConfigView) -> pb::ModelConfig {
    let dims = |dims: &[usize]| dims.iter().map(|&d| d as i64).collect();
    pb::ModelConfig {
        name: view.name,
        platform: view.platform.to_string(),
        backend: view.backend.to_string(),
        max_batch_size: i32::try_from(view.max_batch_size).unwrap_or(i32::MAX),
        input: view
            .input
            .iter()
            .map(|t| pb::ModelInput {
                name: t.name.clone(),
                data_type: config_type(t.datatype),
                dims: dims(&t.dims),
            })
            .collect(),
        output: view
            .output
            .iter()
            .map(|t| pb::ModelOutput {
                name: t.name.clone(),
                data_type: config_type(t.datatype),
                dims: dims(&t.dims),
            })
            .collect(),
        instance_group: view
            .instance_group
            .into_iter()
            .map(|g| pb::ModelInstanceGroup {
                name: g.name,
                count: i32::try_from(g.count).unwrap_or(i32::MAX),
                gpus: g
                    .gpus
                    .iter()
                    .map(|&n| i32::try_from(n).unwrap_or(i32::MAX))
                    .collect(),
                kind: match g.kind {
                    InstanceKind::Cpu => pb::model_instance_group::Kind::Cpu,
                    InstanceKind::Gpu => pb::model_instance_group::Kind::Gpu,
                } as i32,
            })
            .collect(),
        scheduling_choice: match (view.dynamic_batching, view.sequence_batching) {
            (_, Some(sequence)) => Some(SchedulingChoice::SequenceBatching(sequence_batching(
                sequence,
            ))),
            (Some(dynamic), None) => Some(SchedulingChoice::DynamicBatching(
                pb::ModelDynamicBatching {
                    preferred_batch_size: sizes(&dynamic.preferred_batch_size),
                    max_queue_delay_microseconds: dynamic.max_queue_delay_microseconds,
                    priority_levels: dynamic.priority_levels,
                    default_priority_level: dynamic.default_priority_level,
                    default_queue_policy: dynamic.default_queue_policy.map(queue_policy),
                    priority_queue_policy: dynamic
                        .priority_queue_policy
                        .iter()
                        .map(|(level, policy)| (*level, queue_policy(*policy)))
                        .collect(),
                },
            )),
            (None, None) => None,
        },
        parameters: view
            .parameters
            .into_iter()
            .map(|(k, v)| {
                (
                    k.to_string(),
                    pb::ModelParameter {
                        string_value: v.string_value,
                    },
                )
            })
            .collect(),
    }
}

#[tonic::async_trait]
impl GrpcInferenceService for InferenceService {
    async fn repository_index(
        &self,
        request: Request<pb::RepositoryIndexRequest>,
    ) -> Result<Response<pb::RepositoryIndexResponse>, Status> {
        let r = request.into_inner();
        let entries = control::index(&self.edge, r.ready)
            .await
            .map_err(|e| status(&e))?;
        Ok(Response::new(pb::RepositoryIndexResponse {
            models: entries
                .into_iter()
                .map(|e| pb::repository_index_response::ModelIndex {
                    name: e.name,
                    version: e.version,
                    state: e.state.to_string(),
                    reason: e.reason,
                })
                .collect(),
        }))
    }

    async fn repository_model_load(
        &self,
        request: Request<pb::RepositoryModelLoadRequest>,
    ) -> Result<Response<pb::RepositoryModelLoadResponse>, Status> {
        let r = request.into_inner();
        control::change(
            &self.edge,
            Protocol::Grpc,
            control::Operation::Load,
            r.model_name,
        )
        .await
        .map_err(|e| status(&e))?;
        Ok(Response::new(pb::RepositoryModelLoadResponse {}))
    }

    async fn repository_model_unload(
        &self,
        request: Request<pb::RepositoryModelUnloadRequest>,
    ) -> Result<Response<pb::RepositoryModelUnloadResponse>, Status> {
        let r = request.into_inner();
        control::change(
            &self.edge,
            Protocol::Grpc,
            control::Operation::Unload,
            r.model_name,
        )
        .await
        .map_err(|e| status(&e))?;
        Ok(Response::new(pb::RepositoryModelUnloadResponse {}))
    }

    async fn server_live(
        &self,
        _: Request<pb::ServerLiveRequest>,
    ) -> Result<Response<pb::ServerLiveResponse>, Status> {
        Ok(Response::new(pb::ServerLiveResponse { live: true }))
    }

    async fn server_ready(
        &self,
        _: Request<pb::ServerReadyRequest>,
    ) -> Result<Response<pb::ServerReadyResponse>, Status> {
        Ok(Response::new(pb::ServerReadyResponse {
            ready: self.edge.server_ready(),
        }))
    }

    async fn model_ready(
        &self,
        request: Request<pb::ModelReadyRequest>,
    ) -> Result<Response<pb::ModelReadyResponse>, Status> {
        let r = request.into_inner();
        let ready = match self.edge.runtime.model(&r.name, optional(&r.version)) {
            Ok(handle) => self.edge.model_ready(&handle),
            Err(e @ Error::ModelNotFound { .. }) => return Err(status(&e)),
            Err(_) => false,
        };
        Ok(Response::new(pb::ModelReadyResponse { ready }))
    }

    async fn server_metadata(
        &self,
        _: Request<pb::ServerMetadataRequest>,
    ) -> Result<Response<pb::ServerMetadataResponse>, Status> {
        Ok(Response::new(pb::ServerMetadataResponse {
            name: SERVER_NAME.to_string(),
            version: SERVER_VERSION.to_string(),
            extensions: EXTENSIONS.iter().map(|e| e.to_string()).collect(),
        }))
    }

    async fn model_metadata(
        &self,
        request: Request<pb::ModelMetadataRequest>,
    ) -> Result<Response<pb::ModelMetadataResponse>, Status> {
        let r = request.into_inner();
        let handle = self.model(&r.name, &r.version)?;
        let versions = self
            .edge
            .runtime
            .models()
            .get(handle.name.as_str())
            .map(|m| m.ready_versions())
            .unwrap_or_default();
        Ok(Response::new(pb::ModelMetadataResponse {
            name: handle.name.clone(),
            versions,
            platform: ModelConfigView::of(&handle.name, &handle.loaded)
                .platform
                .to_string(),
            inputs: tensor_metadata(&handle.signature.inputs),
            outputs: tensor_metadata(&handle.signature.outputs),
        }))
    }

    async fn model_infer(
        &self,
        request: Request<pb::ModelInferRequest>,
    ) -> Result<Response<pb::ModelInferResponse>, Status> {
        unary::answer_message(&self.edge, request).await
    }

    type ModelStreamInferStream = stream::AnswerStream;

    async fn model_stream_infer(
        &self,
        request: Request<tonic::Streaming<pb::ModelInferRequest>>,
    ) -> Result<Response<Self::ModelStreamInferStream>, Status> {
        Ok(stream::serve(Arc::clone(&self.edge), request))
    }

    async fn model_config(
        &self,
        request: Request<pb::ModelConfigRequest>,
    ) -> Result<Response<pb::ModelConfigResponse>, Status> {
        let r = request.into_inner();
        let handle = self.model(&r.name, &r.version)?;
        let view = ModelConfigView::of(&handle.name, &handle.loaded);
        Ok(Response::new(pb::ModelConfigResponse {
            config: Some(model_config(view)),
        }))
    }

    async fn model_statistics(
        &self,
        request: Request<pb::ModelStatisticsRequest>,
    ) -> Result<Response<pb::ModelStatisticsResponse>, Status> {
        let r = request.into_inner();
        let model_stats = if r.name.is_empty() {
            self.edge
                .runtime
                .ready_handles()
                .iter()
                .map(|h| model_statistics(h))
                .collect()
        } else {
            vec![model_statistics(&*self.model(&r.name, &r.version)?)]
        };
        Ok(Response::new(pb::ModelStatisticsResponse { model_stats }))
    }
}
