//! The gRPC side of the sequence-state API (`tickserve.SequenceService`,
//! `proto/tickserve_sequence.proto`): list a stateful model's sequences,
//! read, write and drop a sequence's state. In the `model_repository` group
//! of the restricted APIs. Its messages are small (one sequence's state), so
//! the service decodes at most [`MAX_MESSAGE_BYTES`].

use std::sync::Arc;

use tickserve_core::sequence::{KeyId, SequenceId};
use tickserve_core::{DataType, Error, InputTensor};
use tickserve_runtime::Sequences;
use tonic::{Request, Response, Status};

use super::{optional, status};
use tickserve_edge::Edge;
use tickserve_edge::state_turn_deadline;

use tickserve_proto::tickserve as pb;

use pb::sequence_service_server::{SequenceService, SequenceServiceServer};

/// The largest message the service decodes.
pub const MAX_MESSAGE_BYTES: usize = 1024 * 1024;

/// The sequence-state service over the edge.
pub struct Sequence {
    edge: Arc<Edge>,
}

impl Sequence {
    /// The service, ready to add to a router.
    pub fn service(edge: Arc<Edge>) -> SequenceServiceServer<Sequence> {
        SequenceServiceServer::new(Sequence { edge }).max_decoding_message_size(MAX_MESSAGE_BYTES)
    }

    fn stateful(&self, model: &str, version: &str) -> Result<(String, Arc<Sequences>), Status> {
        let (handle, sequences) = self
            .edge
            .stateful(model, optional(version))
            .map_err(|e| status(&e))?;
        Ok((handle.name.clone(), sequences))
    }
}

fn id_of(model: &str, id: Option<pb::SequenceId>) -> Result<SequenceId, Status> {
    let checked = match id.and_then(|i| i.id) {
        Some(pb::sequence_id::Id::Number(n)) => SequenceId::number(model, n),
        Some(pb::sequence_id::Id::Text(s)) => SequenceId::text(model, &s),
        None => Err(Error::request(
            model,
            "the request names no sequence (sequence_id)",
        )),
    };
    checked.map_err(|e| status(&e))
}

fn id_message(id: &SequenceId) -> pb::SequenceId {
    pb::SequenceId {
        id: Some(match id {
            SequenceId::Number(n) => pb::sequence_id::Id::Number(*n),
            SequenceId::Text(s) => pb::sequence_id::Id::Text(s.clone()),
        }),
    }
}

#[tonic::async_trait]
impl SequenceService for Sequence {
    async fn sequence_list(
        &self,
        request: Request<pb::SequenceListRequest>,
    ) -> Result<Response<pb::SequenceListResponse>, Status> {
        let owner = request.extensions().get::<KeyId>().copied();
        let r = request.into_inner();
        let (_, sequences) = self.stateful(&r.model_name, &r.model_version)?;
        Ok(Response::new(pb::SequenceListResponse {
            sequences: sequences
                .list(owner)
                .iter()
                .map(|s| pb::sequence_list_response::Entry {
                    sequence_id: Some(id_message(&s.id)),
                    ticks: s.ticks,
                    idle_microseconds: tickserve_core::durations::micros(s.idle),
                })
                .collect(),
        }))
    }

    async fn sequence_state_read(
        &self,
        request: Request<pb::SequenceRequest>,
    ) -> Result<Response<pb::SequenceState>, Status> {
        let owner = request.extensions().get::<KeyId>().copied();
        let r = request.into_inner();
        let (model, sequences) = self.stateful(&r.model_name, &r.model_version)?;
        let id = id_of(&model, r.sequence_id)?;
        let state = sequences
            .read(&id, owner, state_turn_deadline())
            .await
            .map_err(|e| status(&e))?;
        Ok(Response::new(pb::SequenceState {
            sequence_id: Some(id_message(&id)),
            ticks: state.ticks,
            idle_microseconds: tickserve_core::durations::micros(state.idle),
            state: sequences
                .spec()
                .state_tensors(&state.state, state.window_ticks)
                .into_iter()
                .map(|t| pb::StateTensor {
                    name: t.name.into(),
                    datatype: t.datatype.as_str().to_string(),
                    shape: t.shape,
                    contents: t.data,
                })
                .collect(),
        }))
    }

    async fn sequence_state_write(
        &self,
        request: Request<pb::SequenceStateWriteRequest>,
    ) -> Result<Response<pb::SequenceStateWriteResponse>, Status> {
        let owner = request.extensions().get::<KeyId>().copied();
        let r = request.into_inner();
        let (model, sequences) = self.stateful(&r.model_name, &r.model_version)?;
        let id = id_of(&model, r.sequence_id)?;
        let tensors = r
            .state
            .into_iter()
            .map(|t| {
                let datatype = DataType::parse(&t.datatype).ok_or_else(|| {
                    Error::input(
                        &model,
                        &t.name,
                        "a datatype such as FP32",
                        t.datatype.clone(),
                    )
                })?;
                Ok(InputTensor {
                    name: t.name,
                    datatype,
                    shape: t.shape,
                    data: t.contents,
                })
            })
            .collect::<Result<Vec<InputTensor>, Error>>()
            .map_err(|e| status(&e))?;
        let (rows, window_ticks) = sequences
            .spec()
            .state_rows(&model, tensors)
            .map_err(|e| status(&e))?;
        sequences
            .write(&id, rows, window_ticks, owner, state_turn_deadline())
            .await
            .map_err(|e| status(&e))?;
        Ok(Response::new(pb::SequenceStateWriteResponse {}))
    }

    async fn sequence_drop(
        &self,
        request: Request<pb::SequenceRequest>,
    ) -> Result<Response<pb::SequenceDropResponse>, Status> {
        let owner = request.extensions().get::<KeyId>().copied();
        let r = request.into_inner();
        let (model, sequences) = self.stateful(&r.model_name, &r.model_version)?;
        let id = id_of(&model, r.sequence_id)?;
        sequences
            .remove(&id, owner, state_turn_deadline())
            .await
            .map_err(|e| status(&e))?;
        Ok(Response::new(pb::SequenceDropResponse {}))
    }
}
