//! The gRPC port: v2's `GRPCInferenceService`, TF Serving's
//! `PredictionService` and `ModelService`, the sequence-state service and
//! `grpc.health.v1`, behind one check: the port's method table names each
//! method's key group, a method not in it is answered UNIMPLEMENTED, and the
//! key of the group is checked before any service sees the call. Health
//! `Watch` streams are bounded server-wide (`server.max_health_watches`).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};

use crate::listen::budget::BodyRules;
use crate::listen::{self, ConnectionLimits};
use crate::tls::Tls;
use crate::transport::access::Access;
use crate::transport::routes::grpc_group;
use crate::transport::status::{self, Refusal};
use crate::{grpc, tfserving};
use tickserve_edge::Edge;

/// Serves gRPC on `listener` behind `access`, over `tls` when given, within
/// `limits`, until `stop` turns true.
pub async fn serve(
    listener: tokio::net::TcpListener,
    edge: Arc<Edge>,
    access: Access,
    tls: Option<Arc<Tls>>,
    limits: Arc<ConnectionLimits>,
    max_health_watches: usize,
    stop: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let limit = edge.max_request_bytes;
    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_serving::<grpc::Server>().await;
    let (predictions, model_status) =
        tfserving::grpc::TfServing::services(Arc::clone(&edge), limit);
    // Served by hyper (`listen`) rather than tonic's transport: tonic's
    // transport answers a `grpc-timeout` that runs out with CANCELLED before the
    // handler runs; tickserve applies the deadline itself (it is checked when
    // the request is dispatched) and answers DEADLINE_EXCEEDED.
    let router = tonic::service::Routes::new(health_service)
        .add_service(grpc::service(Arc::clone(&edge), limit))
        .add_service(predictions)
        .add_service(model_status)
        .add_service(grpc::sequences::Sequence::service(Arc::clone(&edge)))
        .add_service(grpc::risk::Risk::service(Arc::clone(&edge)))
        .into_axum_router()
        // The unary inference, served from its message's bytes.
        .route_service(
            grpc::unary::PATH,
            grpc::unary::ModelInfer::new(Arc::clone(&edge), limit),
        )
        .layer(tower::util::MapResponseLayer::new(
            status::grpc_oversized_is_invalid_argument::<axum::body::Body>,
        ))
        .layer(axum::middleware::from_fn_with_state(
            Arc::new(Guard {
                access,
                watches: Arc::new(Semaphore::new(max_health_watches)),
            }),
            guard,
        ));
    let mut stopping = stop.clone();
    tokio::spawn(async move {
        let _ = stopping.wait_for(|stopped| *stopped).await;
        health.set_not_serving::<grpc::Server>().await;
    });
    let rules = BodyRules {
        refuse: |error| Box::new(status::grpc(&error)),
        stream: |path| path == STREAM_METHOD,
        grpc: true,
    };
    listen::serve(listener, router, (edge, rules), tls, limits, "grpc", stop).await
}

/// The one method whose request body is a stream (no body deadline).
const STREAM_METHOD: &str = "/inference.GRPCInferenceService/ModelStreamInfer";

/// The health service's server-streaming method.
const WATCH_METHOD: &str = "/grpc.health.v1.Health/Watch";

/// What the port checks before a service sees a call.
struct Guard {
    access: Access,
    /// A permit per open health `Watch` stream.
    watches: Arc<Semaphore>,
}

/// Refuses a call of a method the port does not serve, or of a restricted
/// group without its key, or a health `Watch` beyond the bound, before any
/// service sees it.
async fn guard(State(guard): State<Arc<Guard>>, mut request: Request, next: Next) -> Response {
    let path = request.uri().path().to_string();
    let admitted = match grpc_group(&path) {
        None => Err(Refusal::NoRoute(format!("for the gRPC method {path}"))),
        Some(group) => guard.access.admit(group, request.headers()),
    };
    match admitted {
        Err(refusal) => return refusal.grpc().into_http::<axum::body::Body>(),
        // The key the call carried, for what binds to it (sequences).
        Ok(Some(key)) => {
            request.extensions_mut().insert(key);
        }
        Ok(None) => {}
    }
    if path != WATCH_METHOD {
        let response = next.run(request).await;
        return status::grpc_missing_message_is_invalid_argument(response, &path);
    }
    let Ok(permit) = Arc::clone(&guard.watches).try_acquire_owned() else {
        let message = "the server has server.max_health_watches health Watch streams open; \
                       use Check, or retry later";
        return tonic::Status::resource_exhausted(message).into_http::<axum::body::Body>();
    };
    // The permit goes with the stream's answer, until it ends.
    next.run(request).await.map(|body| {
        axum::body::Body::new(Permitted {
            body,
            _permit: permit,
        })
    })
}

/// A response body holding a permit until it is dropped.
struct Permitted {
    body: axum::body::Body,
    _permit: OwnedSemaphorePermit,
}

impl http_body::Body for Permitted {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        std::pin::Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}
