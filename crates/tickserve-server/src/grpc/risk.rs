//! The kill switch over gRPC (`tickserve.RiskService`,
//! `proto/tickserve_risk.proto`): halt and resume one model version, as
//! HTTP's `.../versions/V/halt` and `.../resume` do, in the
//! `model_repository` key group.

use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::status;
use tickserve_core::config::FrontEnd;
use tickserve_edge::Edge;
use tickserve_edge::{MAX_REASON_BYTES, RiskAsk, version_of};

use tickserve_proto::tickserve as pb;

use pb::risk_service_server::{RiskService, RiskServiceServer};

/// The largest message the service decodes: a name, a version, a reason.
const MAX_MESSAGE_BYTES: usize = 4 * MAX_REASON_BYTES + 4096;

/// The risk service over the edge's halts.
pub struct Risk {
    edge: Arc<Edge>,
}

impl Risk {
    /// The service, ready to add to a router.
    pub fn service(edge: Arc<Edge>) -> RiskServiceServer<Risk> {
        RiskServiceServer::new(Risk { edge }).max_decoding_message_size(MAX_MESSAGE_BYTES)
    }
}

#[tonic::async_trait]
impl RiskService for Risk {
    async fn model_halt(
        &self,
        request: Request<pb::ModelHaltRequest>,
    ) -> Result<Response<pb::ModelHaltResponse>, Status> {
        let r = request.into_inner();
        self.edge
            .risk
            .allows(FrontEnd::Grpc, &r.name, RiskAsk::Halt)
            .map_err(|e| status(&e))?;
        let handle = version_of(&self.edge, &r.name, Some(&r.version)).map_err(|e| status(&e))?;
        let (model, version) = (handle.name.clone(), handle.version.clone());
        let changed = self.edge.halts.halt(&handle, &r.reason, "grpc").await;
        let (halt, kept) = (changed.halt, changed.kept);
        Ok(Response::new(pb::ModelHaltResponse {
            model_name: model,
            model_version: version,
            reason: halt.reason,
            by: halt.by,
            since: halt.since,
            kept: kept.is_ok(),
        }))
    }

    async fn model_resume(
        &self,
        request: Request<pb::ModelResumeRequest>,
    ) -> Result<Response<pb::ModelResumeResponse>, Status> {
        let r = request.into_inner();
        let handle = version_of(&self.edge, &r.name, Some(&r.version)).map_err(|e| status(&e))?;
        let (model, version) = (handle.name.clone(), handle.version.clone());
        let lifting = self.edge.halts.check(&model, &version);
        self.edge
            .risk
            .allows(FrontEnd::Grpc, &model, RiskAsk::Resume(lifting.as_ref()))
            .map_err(|e| status(&e))?;
        let changed = self.edge.halts.resume(&handle, "grpc").await;
        let (halt, kept) = (changed.halt, changed.kept);
        Ok(Response::new(pb::ModelResumeResponse {
            model_name: model,
            model_version: version,
            resumed: halt.is_some(),
            kept: kept.is_ok(),
        }))
    }
}
